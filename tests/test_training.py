"""Real training runs on a tiny model and BabyAI: resume exactness and learning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from agentgym_core.config.load import load_config
from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model
from agentgym_core.plugins import PluginHost
from agentgym_core.run.train import TrainStage

pytest.importorskip("agentgym_env_babyai")


def _config(tmp_path: Path, model: Path, out: str, **trainer) -> Path:
    raw = {
        "run": {"name": "t", "output_dir": str(tmp_path / out), "seed": 3},
        "model": {"path": str(model)},
        "env": {"name": "babyai", "levels": ["GoToObj", "PickupDist"], "list_actions": False},
        "algorithm": {"name": "grpo"},
        "scheduler": {"name": "fixed", "max_turns": 2},
        "rollout": {"max_context_tokens": 768, "concurrency": 16},
        "trainer": {
            "steps": 4,
            "tasks_per_step": 4,
            "group_size": 4,
            "lr": 1e-3,
            "checkpoint_every": 2,
            **trainer,
        },
        "tracking": {"log_trajectories": 2},
    }
    path = tmp_path / f"{out}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def babyai_model(tmp_path_factory) -> Path:
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    env = BabyAIEnv(BabyAIConfig(levels=["GoToObj", "PickupDist"], list_actions=False))
    texts = env_corpus(env, env.tasks("train")[:60], max_turns=4)
    return init_model(
        texts, tmp_path_factory.mktemp("babyai-model"), TinyModelConfig(vocab_size=400)
    )


def _train(path: Path, host: PluginHost, *overrides: str):
    resolved = load_config(path, list(overrides), host.registry)
    return TrainStage(resolved, host).run(show_progress=False)


def test_resume_continues_exactly(tmp_path, babyai_model):
    host = PluginHost()
    straight = _train(_config(tmp_path, babyai_model, "straight"), host)
    interrupted = _config(tmp_path, babyai_model, "resumed")
    first = _train(interrupted, host, "trainer.steps=2")
    assert first.resumed_from == 0 and len(first.history) == 2
    resumed = _train(interrupted, host)
    assert resumed.resumed_from == 2
    keys = ["rollout/success_rate", "rollout/reward_mean", "rollout/generated_tokens", "train/loss"]
    for step in (2, 3):
        for key in keys:
            assert resumed.history[step][key] == pytest.approx(
                straight.history[step][key], abs=1e-6
            )
    a = AutoModelForCausalLM.from_pretrained(straight.checkpoint).state_dict()
    b = AutoModelForCausalLM.from_pretrained(resumed.checkpoint).state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_checkpoint_is_a_plain_hugging_face_folder(tmp_path, babyai_model):
    result = _train(_config(tmp_path, babyai_model, "plain", steps=2), PluginHost())
    assert (result.checkpoint / "config.json").is_file()
    assert (result.checkpoint / "trainer_state.pt").is_file()
    assert AutoModelForCausalLM.from_pretrained(result.checkpoint) is not None


def test_short_run_beats_the_untrained_model(tmp_path, babyai_model):
    """GRPO on GoToObj for a few updates: held-out success rises by a clear margin."""
    from agentgym_core.run.pipeline import run_eval_stage

    host = PluginHost()
    path = _config(
        tmp_path,
        babyai_model,
        "learn",
        steps=25,
        tasks_per_step=8,
        group_size=8,
        lr=2e-3,
        checkpoint_every=0,
    )
    overrides = [
        "env.levels=[GoToObj]",
        "eval.num_tasks=80",
        "eval.max_turns=2",
        "env.instruction=Reach the goal.",
    ]
    resolved = load_config(path, overrides, host.registry)
    before, _ = run_eval_stage(resolved, host, babyai_model)
    trained = TrainStage(resolved, host).run(show_progress=False)
    after, _ = run_eval_stage(resolved, host, trained.checkpoint)
    print("success before", before["success_rate"], "after", after["success_rate"])
    assert after["success_rate"] >= before["success_rate"] + 0.2, (before, after)
