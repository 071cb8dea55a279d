"""sciworld in the pipeline: a two-update GRPO run on a tiny model, and expert data for SFT."""

from __future__ import annotations

import json
import math

import torch
from transformers import AutoModelForCausalLM

from agentgym_core.cli import main as agentgym

ENV = {"tasks": ["find-plant"], "max_variations": 20, "list_valid_actions": True}
"""Constrained to ScienceWorld's valid actions, a random agent sometimes opens a door or walks
through one (partial credit) and mostly does not: GRPO groups with different rewards."""
INSTRUCTION = "Find a plant. Answer with one action."
TINY_MODEL = {
    "corpus_tasks": 3,
    "corpus_turns": 2,
    "vocab_size": 600,
    "max_position_embeddings": 4096,
}


def test_two_grpo_updates_on_the_real_simulator(agentgym_train, java, java_descendants):
    raw = {
        "run": {"name": "sciworld-smoke", "seed": 0},
        "env": {"name": "sciworld", **ENV, "instruction": INSTRUCTION},
        "algorithm": {"name": "grpo"},
        "scheduler": {"name": "fixed", "max_turns": 3},
        "rollout": {"max_context_tokens": 4096, "concurrency": 2, "env_threads": 2},
        "trainer": {
            "steps": 2,
            "tasks_per_step": 2,
            "group_size": 4,
            "lr": 1e-3,
            "checkpoint_every": 0,
        },
    }
    run = agentgym_train(raw, tiny_model=TINY_MODEL)

    assert len(run.history) == 2
    for metrics in run.history:
        assert metrics["rollout/episodes"] == 8 and metrics["rollout/env_errors"] == 0
        assert 1 <= metrics["rollout/turns_mean"] <= 3
        assert "rollout/group/find-plant/success_rate" in metrics
        assert math.isfinite(metrics["train/loss"])
    assert any(m["rollout/reward_mean"] > 0 for m in run.history)
    assert any(m["train/grad_norm"] > 0 for m in run.history)
    before = AutoModelForCausalLM.from_pretrained(run.model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(run.checkpoint).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    assert not java_descendants()  # the engine closed every env of its pool


def test_expert_data_command_writes_successful_agenttraj(tmp_path, java, capsys):
    out = tmp_path / "sciworld-expert.json"
    code = agentgym(
        [
            "data",
            "expert",
            "sciworld",
            "--episodes",
            "2",
            "--split",
            "test",
            "--env-option",
            "tasks=[find-animal, power-component]",
            "--env-option",
            "max_variations=1",
            "--out",
            str(out),
        ]
    )
    assert code == 0 and "success 1.00" in capsys.readouterr().out
    items = json.loads(out.read_text())
    assert [item["item_id"] for item in items] == ["sciworld_140225", "sciworld_70015"]
    for item in items:
        turns = item["conversations"]
        assert turns[0]["value"].startswith("You are a scientist in ScienceWorld")
        assert turns[2]["value"].startswith("Task: Your task is to")
        actions = [t["value"] for t in turns if t["loss"] is True]
        assert any(a.startswith("focus on") for a in actions)
