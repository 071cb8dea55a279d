"""Two GRPO updates of a tiny from-scratch model on the search env, through the real trainer."""

from __future__ import annotations

import torch
from agentgym_env_search.env import INVALID
from transformers import AutoModelForCausalLM

from agentgym_core.types import Termination

ENV = {"name": "search", "top_k": 1, "max_passage_chars": 120}
TINY_MODEL = {"corpus_tasks": 30, "corpus_turns": 2, "expert_turns": 5, "vocab_size": 400}
"""The tokenizer sees the env's text and the expert's actions (free text: `search[...]`)."""


def test_two_grpo_updates_run_on_search_episodes(agentgym_train, search_cache, monkeypatch):
    monkeypatch.setenv("AGENTGYM_LOAD_PLUGINS", "search,grpo,fixed")  # only what the run uses
    raw = {
        "run": {"name": "search-smoke", "seed": 1},
        "env": {**ENV, "cache_dir": str(search_cache)},
        # entropy_coef: an untrained model never answers right, so every group's rewards tie
        # and GRPO's advantages are 0; the entropy bonus still gives the update a gradient.
        "algorithm": {"name": "grpo", "entropy_coef": 0.01},
        "scheduler": {"name": "fixed", "max_turns": 2},
        "rollout": {"max_context_tokens": 640, "max_new_tokens": 12, "constrained": False},
        "trainer": {"steps": 2, "tasks_per_step": 2, "group_size": 2, "lr": 1e-3},
    }
    run = agentgym_train(raw, tiny_model=TINY_MODEL)

    assert len(run.history) == 2 and len(run.batches) == 2
    for metrics in run.history:
        assert metrics["rollout/episodes"] == 4 and metrics["rollout/env_errors"] == 0
        assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    trajectories = [t for batch in run.batches.values() for t in batch]
    assert {t.task_group for t in trajectories} <= {"single", "multi"}
    assert all(t.termination != Termination.ENV_ERROR for t in trajectories)
    # a second turn means the env's observation was appended and generation went on after it
    assert any(t.num_turns == 2 and t.termination == Termination.HORIZON for t in trajectories)
    turns = [turn for t in trajectories for turn in t.turns]
    assert turns and all(
        turn.observation == INVALID
        or turn.observation.startswith(("Results of search[", "No passage", "Your answer"))
        or "needs text inside the brackets" in turn.observation
        for turn in turns
    )
    before = AutoModelForCausalLM.from_pretrained(run.model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(run.checkpoint).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
