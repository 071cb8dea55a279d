"""A real BabyAI run: each update's horizon is the one its history decides, across a resume."""

from __future__ import annotations

import pytest
from agentgym_sched_adaptive import AdaptiveScheduler

pytest.importorskip("agentgym_env_babyai")
LEVELS = ["GoToObj", "PickupDist"]


def test_horizon_grows_as_the_history_says_across_a_resume(agentgym_train):
    # window 1, patience 2, threshold 1.5: a success rate cannot rise by 1.5, so every
    # second update at a horizon is a plateau: 1, 1 turn, then 2 from update 2.
    config = {
        "run": {"name": "adaptive", "seed": 3},
        "env": {"name": "babyai", "levels": LEVELS, "list_actions": False},
        "algorithm": {"name": "grpo"},
        "scheduler": {
            "name": "adaptive",
            "min_turns": 1,
            "max_turns": 3,
            "window": 1,
            "patience": 2,
            "threshold": 1.5,
        },
        "rollout": {"max_context_tokens": 768, "concurrency": 16},
        "trainer": {"steps": 3, "tasks_per_step": 2, "group_size": 2, "checkpoint_every": 1},
    }
    tiny_model = {"corpus_tasks": 60, "corpus_turns": 4, "vocab_size": 400}

    stopped = agentgym_train(config, ["trainer.steps=2"], tiny_model=tiny_model)
    assert isinstance(stopped.scheduler, AdaptiveScheduler)
    assert [m["rollout/horizon"] for m in stopped.history] == [1.0, 1.0]

    resumed = agentgym_train(config, tiny_model=tiny_model, output_dir=stopped.output_dir)
    assert resumed.resumed_from == 2
    history = resumed.history
    assert [m["rollout/horizon"] for m in history] == [1.0, 1.0, 2.0]
    scheduler = resumed.scheduler
    assert scheduler.horizons(history)[:-1] == [1, 1, 2]
    assert [(d.step, d.before, d.after) for d in scheduler.decisions(history)] == [(2, 1, 2)]
    assert all(m["rollout/turns_mean"] <= m["rollout/horizon"] for m in history)
