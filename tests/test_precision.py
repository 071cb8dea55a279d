"""bfloat16 training: float32 masters keep the small steps that bfloat16 would round away."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import yaml

from agentgym_core import hookimpl
from agentgym_core.config.load import load_config
from agentgym_core.learner.lora import load_file_weights
from agentgym_core.learner.precision import MasterWeights
from agentgym_core.plugins import PluginHost
from agentgym_core.run import runtime
from agentgym_core.run.checkpoint import checkpoint_dir, restore_learner
from agentgym_core.run.kinds import run_stage


def test_masters_keep_steps_below_a_bfloat16_ulp():
    """1.0 in bfloat16 has 1 - 2**-8 = 0.99609375 below it: a step of 0.001 rounds back to 1.0;
    two add up past the midpoint 0.998046875 and the weight moves down a whole ulp."""
    layer = torch.nn.Linear(1, 1, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.fill_(1.0)
    masters = MasterWeights(layer.parameters())
    (master,) = masters.optimized(layer.parameters())
    assert master.dtype == torch.float32 and master is not layer.weight
    optimizer = torch.optim.SGD([master], lr=0.001)
    seen = []
    for _ in range(5):
        layer.weight.grad = torch.ones_like(layer.weight)  # d loss / d w = 1
        masters.gradients_to_masters()
        assert layer.weight.grad is None and master.grad.dtype == torch.float32
        optimizer.step()
        masters.masters_to_model()
        seen.append((float(master.detach()), float(layer.weight.detach())))
    assert [m for m, _ in seen] == pytest.approx([0.999, 0.998, 0.997, 0.996, 0.995], abs=1e-6)
    assert [w for _, w in seen] == [1.0, 0.99609375, 0.99609375, 0.99609375, 0.99609375]
    plain = torch.nn.Linear(1, 1, bias=False).to(torch.bfloat16)  # bfloat16 AdamW-free SGD
    with torch.no_grad():
        plain.weight.fill_(1.0)
    for _ in range(5):
        plain.weight.grad = torch.ones_like(plain.weight)
        torch.optim.SGD(plain.parameters(), lr=0.001).step()
    assert float(plain.weight.detach()) == 1.0  # without masters each step rounds back to 1.0


def test_a_float32_parameter_gets_no_master():
    layer = torch.nn.Linear(2, 2)
    masters = MasterWeights(layer.parameters())
    assert masters.pairs == [] and masters.optimized(layer.parameters()) == list(layer.parameters())


class CrashAfterCheckpoint:
    @hookimpl
    def agentgym_on_checkpoint(self, step, path):
        if step == 2:
            raise KeyboardInterrupt("killed after checkpoint 2")


@pytest.fixture(scope="module")
def babyai_model(tmp_path_factory) -> Path:
    pytest.importorskip("agentgym_env_babyai")
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model

    env = BabyAIEnv(BabyAIConfig(levels=["GoToObj"], list_actions=False))
    texts = env_corpus(env, env.tasks("train")[:60], max_turns=4)
    return init_model(texts, tmp_path_factory.mktemp("model"), TinyModelConfig(vocab_size=400))


@pytest.mark.parametrize("lora", [None, "float32", "model"])
def test_bfloat16_training_runs_and_resumes_exactly(tmp_path, babyai_model, lora, monkeypatch):
    """Full fine-tuning, a float32 adapter (PEFT's default) and a bfloat16 one
    (`adapter_dtype: model`): the low-precision trained weights step through masters.

    The resumed learner holds the checkpoint's masters, optimizer state and weights
    bit for bit. The updates after it are compared with the straight run's loosely:
    bfloat16 CPU kernels round differently with the thread count and the process's
    state (a resume that lost the masters moves the loss by only ~3e-7 here, so a
    tight comparison of losses would not catch it anyway, but flakes: a busy 2-core
    machine's resumed KL differed from the straight run's by 0.47%, 1.04e-4)."""
    restored = {}

    def restore_and_look(learner, resume):
        out = restore_learner(learner, resume)
        if resume is not None:
            restored["masters"] = learner.masters.state()
            restored["weights"] = [p.detach().clone() for p, _ in learner.masters.pairs]
            restored["optimizer"] = copy.deepcopy(learner.optimizer_state())  # it trains on
        return out

    monkeypatch.setattr(runtime, "restore_learner", restore_and_look)
    raw = {
        "run": {"name": "bf16", "output_dir": str(tmp_path / "straight"), "seed": 5},
        "model": {"path": str(babyai_model), "dtype": "bfloat16"},
        "env": {"name": "babyai", "levels": ["GoToObj"], "list_actions": False},
        "algorithm": {"name": "grpo", "kl_coef": 0.05},
        "scheduler": {"name": "fixed", "max_turns": 2},
        "rollout": {"max_context_tokens": 512, "concurrency": 16},
        "trainer": {
            "steps": 4,
            "tasks_per_step": 4,
            "group_size": 4,
            "lr": 1e-3,
            "checkpoint_every": 2,
        },
        "tracking": {"log_trajectories": 0, "traces": False},
    }
    if lora:
        raw["model"]["lora"] = {"r": 4, "alpha": 8, "adapter_dtype": lora}
    path = tmp_path / "bf16.yaml"
    path.write_text(yaml.safe_dump(raw))
    host = PluginHost()
    straight = run_stage(load_config(path, [], host.registry), host, show_progress=False)
    out = f"run.output_dir={tmp_path / 'resumed'}"
    host.pm.register(CrashAfterCheckpoint(), name="crash")
    with pytest.raises(KeyboardInterrupt):
        run_stage(load_config(path, [out], host.registry), host, show_progress=False)
    host.pm.unregister(name="crash")
    resumed = run_stage(load_config(path, [out], host.registry), host, show_progress=False)
    assert resumed.resumed_from == 2 and len(resumed.history) == 4
    saved = torch.load(
        checkpoint_dir(tmp_path / "resumed", 2) / "trainer_state.pt", weights_only=False
    )
    saved_masters = saved["extra"]["learner"].get("masters", [])
    assert len(restored["masters"]) == len(saved_masters)
    for mine, kept, weight in zip(
        restored["masters"], saved_masters, restored["weights"], strict=True
    ):
        assert torch.equal(mine, kept)  # state() is on the CPU; the weight may be on a GPU
        assert torch.equal(weight, kept.to(weight))
    _assert_same_state(restored["optimizer"], saved["optimizer"])
    for step in (2, 3):
        for key in ("train/loss", "train/kl"):
            assert resumed.history[step][key] == pytest.approx(  # CI saw 0.47% on kl
                straight.history[step][key], rel=0.02, abs=1e-4
            ), (step, key)
    state = torch.load(Path(straight.checkpoint) / "trainer_state.pt", weights_only=False)
    masters = state["extra"]["learner"].get("masters", [])
    if lora == "float32":
        assert masters == []  # PEFT keeps the adapter in float32: nothing to copy
        assert _adapter_dtypes(straight.checkpoint) == {torch.float32}
    else:
        assert masters and all(m.dtype == torch.float32 for m in masters)
        assert any(  # the masters hold more than their bfloat16 rounding
            not torch.equal(m, m.to(torch.bfloat16).float()) for m in masters
        )
    if lora == "model":  # one master per adapter matrix (A and B of each adapted layer)
        assert _adapter_dtypes(straight.checkpoint) == {torch.bfloat16}
        assert len(masters) == len(load_file_weights(straight.checkpoint))
    if lora is None:
        from transformers import AutoModelForCausalLM

        saved = AutoModelForCausalLM.from_pretrained(straight.checkpoint, dtype="auto")
        assert next(saved.parameters()).dtype == torch.bfloat16
    assert all(torch.isfinite(torch.tensor(h["train/loss"])) for h in straight.history)


def _assert_same_state(mine, kept) -> None:
    """Optimizer states (nested dicts and lists of tensors and numbers) equal bit for bit."""
    if isinstance(mine, torch.Tensor):
        assert torch.equal(mine.cpu(), kept.cpu())  # wherever each was put
    elif isinstance(mine, dict):
        assert mine.keys() == kept.keys()
        for key in mine:
            _assert_same_state(mine[key], kept[key])
    elif isinstance(mine, (list, tuple)):
        assert len(mine) == len(kept)
        for a, b in zip(mine, kept, strict=True):
            _assert_same_state(a, b)
    else:
        assert mine == kept


def _adapter_dtypes(checkpoint: str | Path) -> set[torch.dtype]:
    return {w.dtype for w in load_file_weights(checkpoint).values()}
