"""A two-update GRPO run on TextCraft with a tiny from-scratch model and ScalingInter-RL."""

from __future__ import annotations

import math

from transformers import AutoModelForCausalLM

from agentgym_core.types import Termination


def test_two_grpo_updates_with_a_growing_horizon(agentgym_train):
    run = agentgym_train(
        {
            "run": {"name": "textcraft-smoke", "seed": 1},
            "env": {"name": "textcraft", "depths": [1, 2], "distractors": 4},
            "algorithm": {"name": "grpo"},
            "scheduler": {
                "name": "scaling_inter",
                "stages": [{"until_step": 1, "max_turns": 2}, {"until_step": 2, "max_turns": 3}],
            },
            "rollout": {"max_context_tokens": 2048, "max_new_tokens": 48},
            "trainer": {"steps": 2, "tasks_per_step": 2, "group_size": 3, "checkpoint_every": 2},
        },
        tiny_model={"corpus_tasks": 40, "corpus_turns": 4, "vocab_size": 600, "hidden_size": 32},
    )

    assert [h["rollout/horizon"] for h in run.history] == [2.0, 3.0]
    assert all(math.isfinite(h["train/loss"]) for h in run.history)
    assert list(run.batches) == [0, 1]
    for step, batch in run.batches.items():
        trajectories = list(batch)
        assert len(trajectories) == 6
        for traj in trajectories:
            assert traj.termination != Termination.ENV_ERROR, traj.error
            assert traj.task_group in ("depth-1", "depth-2")
            assert 1 <= traj.num_turns <= step + 2
            for turn in traj.turns:  # constrained decoding: only listed actions, all carried out
                assert not turn.observation.startswith("Could not"), (turn.action, turn.observation)
    assert AutoModelForCausalLM.from_pretrained(run.checkpoint) is not None
