"""The test kit's `agentgym_train`: a tiny training stage from a config dict, and its resume."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentgym_core import hookimpl
from agentgym_core.testing import TrainRun

pytest.importorskip("agentgym_env_babyai")

CONFIG = {
    "env": {"name": "babyai", "levels": ["GoToObj", "PickupDist"], "list_actions": False},
    "algorithm": {"name": "grpo"},
    "scheduler": {"name": "fixed", "max_turns": 2},
    "rollout": {"max_context_tokens": 768, "concurrency": 16},
    "trainer": {"steps": 3, "tasks_per_step": 4, "group_size": 4, "lr": 1e-3},
}
TINY = {"corpus_tasks": 60, "vocab_size": 400}
"""The model the BabyAI tests of the plugins train too: one build per session."""


def assert_same_history(got: list[dict[str, float]], expected: list[dict[str, float]]) -> None:
    """Same updates, same metrics, each within float noise; timings aside (they always differ)."""
    assert len(got) == len(expected)
    for step, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        keys = {k for k in mine if "seconds" not in k and not k.endswith("_per_s")}
        assert keys == {k for k in theirs if "seconds" not in k and not k.endswith("_per_s")}
        differ = {
            k: (mine[k], theirs[k]) for k in keys if mine[k] != pytest.approx(theirs[k], abs=1e-6)
        }
        assert not differ, f"update {step}: {differ}"


def weights(run: TrainRun) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(run.checkpoint).state_dict()


def test_two_updates_then_a_resume_repeat_three_straight_ones(agentgym_train):
    straight = agentgym_train(CONFIG, tiny_model=TINY)
    stopped = agentgym_train(CONFIG, ["trainer.steps=2"], tiny_model=TINY)
    resumed = agentgym_train(CONFIG, tiny_model=TINY, output_dir=stopped.output_dir)

    assert straight.model_dir == stopped.model_dir == resumed.model_dir  # built once
    assert straight.output_dir != stopped.output_dir == resumed.output_dir
    assert [straight.resumed_from, stopped.resumed_from, resumed.resumed_from] == [0, 0, 2]
    assert list(straight.batches) == [0, 1, 2]
    assert list(stopped.batches) == [0, 1] and list(resumed.batches) == [2]
    assert len(stopped.history) == 2 and len(resumed.history) == 3
    assert all(m["train/grad_norm"] > 0 for m in straight.history)  # each update learned
    assert_same_history(stopped.history, straight.history[:2])
    assert_same_history(resumed.history, straight.history)
    again, first = resumed.batches[2].trajectories, straight.batches[2].trajectories
    assert len(first) == 4 * 4
    assert [t.token_ids for t in again] == [t.token_ids for t in first]
    assert [t.advantages for t in again] == [t.advantages for t in first]
    a, b, start = weights(straight), weights(resumed), weights(stopped)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert any(not torch.equal(a[k], start[k]) for k in a)  # what the third update changed


class UpdateSteps:
    def __init__(self) -> None:
        self.steps: list[int] = []

    @hookimpl
    def agentgym_after_update(self, step: int) -> None:
        self.steps.append(step)


def test_defaults_overrides_plugins_and_a_given_model(agentgym_train, tiny_model_dir, tmp_path):
    updates = UpdateSteps()
    run = agentgym_train(
        {key: CONFIG[key] for key in ("env", "algorithm", "scheduler")},
        ["trainer.steps=1", "run.seed=5", f"model.path={tiny_model_dir}"],
        plugins={"updates": updates},
    )
    root = run.config.root
    assert (root.run.name, root.run.seed) == ("tiny", 5)
    assert (root.trainer.steps, root.trainer.tasks_per_step, root.trainer.group_size) == (1, 2, 2)
    assert root.tracking.log_trajectories == 0 and root.tracking.traces is False
    assert run.output_dir.parent == tmp_path and run.checkpoint.is_relative_to(run.output_dir)
    assert run.model_dir == tiny_model_dir
    assert updates.steps == [0] and list(run.batches) == [0] and len(run.batches[0]) == 4
    assert len(run.history) == 1 and run.history[0]["rollout/horizon"] == 2.0
    assert type(run.algorithm).__name__ == "GRPO"
    assert run.scheduler.max_turns(0, []) == 2


def test_contradictory_calls_are_refused_before_training(agentgym_train, tiny_model_dir):
    named = {**CONFIG, "model": {"path": str(tiny_model_dir)}}
    with pytest.raises(ValueError, match="tiny_model"):
        agentgym_train(named, tiny_model=TINY)
    with pytest.raises(ValueError, match="stages"):
        agentgym_train({**named, "stages": [{"name": "a", "type": "train"}]})


def test_importing_the_test_kit_loads_neither_torch_nor_a_plugin():
    code = """if True:
        import json, sys
        import agentgym_core.testing, agentgym_core.testing.pytest_plugin
        heavy = [m for m in sys.modules if m.split(".")[0] in ("torch", "transformers")]
        plugins = [m for m in sys.modules if m.startswith("agentgym_") and "core" not in m]
        print(json.dumps(heavy + plugins))
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
