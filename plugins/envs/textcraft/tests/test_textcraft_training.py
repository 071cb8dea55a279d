"""A two-update GRPO run on TextCraft with a tiny from-scratch model and ScalingInter-RL."""

from __future__ import annotations

import math
from pathlib import Path

import yaml
from agentgym_env_textcraft import TextCraftConfig, TextCraftEnv
from transformers import AutoModelForCausalLM

from agentgym_core import hookimpl
from agentgym_core.config.load import load_config
from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model
from agentgym_core.run.train import TrainStage
from agentgym_core.types import Termination


class RolloutRecorder:
    """Keeps every rollout batch the trainer reports."""

    def __init__(self) -> None:
        self.batches = []

    @hookimpl
    def agentgym_after_rollout(self, step, batch, metrics):
        self.batches.append((step, list(batch)))


def test_two_grpo_updates_with_a_growing_horizon(tmp_path, agentgym_plugin):
    env = TextCraftEnv(TextCraftConfig(depths=[1, 2]))
    model = init_model(
        env_corpus(env, env.tasks("train")[:40], max_turns=4),
        tmp_path / "model",
        TinyModelConfig(vocab_size=600, hidden_size=32),
    )
    raw = {
        "run": {"name": "textcraft-smoke", "output_dir": str(tmp_path / "run"), "seed": 1},
        "model": {"path": str(model)},
        "env": {"name": "textcraft", "depths": [1, 2], "distractors": 4},
        "algorithm": {"name": "grpo"},
        "scheduler": {
            "name": "scaling_inter",
            "stages": [{"until_step": 1, "max_turns": 2}, {"until_step": 2, "max_turns": 3}],
        },
        "rollout": {"max_context_tokens": 2048, "max_new_tokens": 48},
        "trainer": {"steps": 2, "tasks_per_step": 2, "group_size": 3, "checkpoint_every": 2},
        "tracking": {"log_trajectories": 0, "traces": False},
    }
    path = tmp_path / "smoke.yaml"
    path.write_text(yaml.safe_dump(raw))
    recorder = RolloutRecorder()
    host = agentgym_plugin(recorder, name="recorder")
    result = TrainStage(load_config(path, [], host.registry), host).run(show_progress=False)

    assert [h["rollout/horizon"] for h in result.history] == [2.0, 3.0]
    assert all(math.isfinite(h["train/loss"]) for h in result.history)
    assert [step for step, _ in recorder.batches] == [0, 1]
    for step, trajectories in recorder.batches:
        assert len(trajectories) == 6
        for traj in trajectories:
            assert traj.termination != Termination.ENV_ERROR, traj.error
            assert traj.task_group in ("depth-1", "depth-2")
            assert 1 <= traj.num_turns <= step + 2
            for turn in traj.turns:  # constrained decoding: only listed actions, all carried out
                assert not turn.observation.startswith("Could not"), (turn.action, turn.observation)
    assert AutoModelForCausalLM.from_pretrained(Path(result.checkpoint)) is not None
