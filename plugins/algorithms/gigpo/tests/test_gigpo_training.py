"""A real run: two GiGPO updates of a tiny model on BabyAI, through the config."""

from __future__ import annotations

import math

import pytest
from agentgym_algo_gigpo import GiGPO, anchor_states, turn_spans

pytest.importorskip("agentgym_env_babyai")
LEVELS = ["GoToObj", "PickupDist"]


def test_two_updates_on_babyai(agentgym_train):
    run = agentgym_train(
        {
            "run": {"name": "gigpo", "seed": 3},
            "env": {"name": "babyai", "levels": LEVELS, "list_actions": False},
            "algorithm": {"name": "gigpo", "omega": 1.0, "gamma": 0.95},
            "scheduler": {"name": "fixed", "max_turns": 3},
            "rollout": {"max_context_tokens": 768, "concurrency": 16},
            "trainer": {"steps": 2, "tasks_per_step": 3, "group_size": 4, "checkpoint_every": 0},
        },
        tiny_model={"corpus_tasks": 60, "corpus_turns": 4, "vocab_size": 400},
    )
    assert isinstance(run.algorithm, GiGPO)

    assert len(run.history) == 2
    assert all(math.isfinite(m["train/loss"]) for m in run.history)
    # each update's batch: the same objects the algorithm then set advantages on
    trained = [t for batch in run.batches.values() for t in batch.trainable]
    assert len(trained) == 2 * 3 * 4
    for t in trained:
        # one run of sampled tokens per turn, one value on each run, 0 elsewhere
        spans = turn_spans(t)
        assert all(len(set(t.advantages[a:b])) == 1 for a, b in spans)
        inside = {i for a, b in spans for i in range(a, b)}
        assert all(v == 0 for i, v in enumerate(t.advantages) if i not in inside)
    for batch in run.batches.values():
        for group in batch.groups().values():
            # every sample of a task starts in the same (reset) state
            assert len({anchor_states(t)[0] for t in group}) == 1
