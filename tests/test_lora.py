"""LoRA through PEFT: the adapter trains alone, resumes exactly, merges, and runs everywhere."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from agentgym_core import hookimpl
from agentgym_core.cli import main as agentgym
from agentgym_core.config.errors import ConfigError
from agentgym_core.config.load import load_config
from agentgym_core.config.schema import ModelConfig
from agentgym_core.learner import lora
from agentgym_core.learner.forward import token_logprobs
from agentgym_core.learner.packing import pack
from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model
from agentgym_core.plugins import PluginHost
from agentgym_core.run.kinds import run_stage
from agentgym_core.run.pipeline import run_pipeline
from agentgym_core.run.runtime import load_training_model
from agentgym_core.run.weights import rollout_copy

pytest.importorskip("peft")
pytest.importorskip("agentgym_env_babyai")

ENV = {"name": "babyai", "levels": ["GoToObj", "PickupDist"], "list_actions": False}
LORA = {"r": 4, "alpha": 8}


@pytest.fixture(scope="module")
def babyai_model(tmp_path_factory) -> Path:
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    env = BabyAIEnv(BabyAIConfig(levels=ENV["levels"], list_actions=False))
    texts = env_corpus(env, env.tasks("train")[:60], max_turns=4)
    return init_model(texts, tmp_path_factory.mktemp("model"), TinyModelConfig(vocab_size=400))


def _raw(tmp_path: Path, model: Path, out: str, **trainer) -> dict:
    return {
        "run": {"name": out, "output_dir": str(tmp_path / out), "seed": 3},
        "model": {"path": str(model), "lora": LORA},
        "env": ENV,
        "algorithm": {"name": "grpo", "kl_coef": 0.1},
        "scheduler": {"name": "fixed", "max_turns": 2},
        "rollout": {"max_context_tokens": 768, "concurrency": 16},
        "trainer": {
            "steps": 4,
            "tasks_per_step": 4,
            "group_size": 4,
            "lr": 1e-2,
            "checkpoint_every": 2,
            **trainer,
        },
        "tracking": {"log_trajectories": 0, "traces": False},
    }


def _train(raw: dict, host: PluginHost, *overrides: str):
    path = Path(raw["run"]["output_dir"]).with_suffix(".yaml")
    path.write_text(yaml.safe_dump(raw))
    return run_stage(load_config(path, list(overrides), host.registry), host, show_progress=False)


class CrashAfterCheckpoint:
    def __init__(self, at: int) -> None:
        self.at = at

    @hookimpl
    def agentgym_on_checkpoint(self, step, path):
        if step == self.at:
            raise KeyboardInterrupt(f"killed after checkpoint {step}")


def _batch_logprobs(model, trajectories) -> torch.Tensor:
    (mb,) = pack(trajectories, row_tokens=None, micro_batch_tokens=100_000)
    with torch.no_grad():
        return token_logprobs(model, mb, 1.0)[0].cpu()[mb.mask.bool()]


def _device(model) -> torch.device:
    """Where a loaded model sits: a GPU machine's device (`make test-gpu-runs`), else the CPU."""
    return next(model.parameters()).device


@pytest.fixture(scope="module")
def trained(tmp_path_factory, babyai_model):
    """A straight 4-update LoRA run, and the same run killed after update 2 and resumed."""
    tmp_path = tmp_path_factory.mktemp("lora")
    host = PluginHost()
    batches = []

    class Keep:
        @hookimpl
        def agentgym_after_rollout(self, step, batch, metrics):
            batches.append(batch)

    host.pm.register(Keep(), name="keep")
    straight = _train(_raw(tmp_path, babyai_model, "straight"), host)
    host.pm.unregister(name="keep")
    interrupted = _raw(tmp_path, babyai_model, "resumed")
    host.pm.register(CrashAfterCheckpoint(2), name="crash")
    with pytest.raises(KeyboardInterrupt):
        _train(interrupted, host)
    host.pm.unregister(name="crash")
    resumed = _train(interrupted, host)
    return straight, resumed, batches


def test_only_the_adapter_trains_and_the_checkpoint_holds_it(trained, babyai_model):
    straight, _, _ = trained
    files = {p.name for p in Path(straight.checkpoint).iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "trainer_state.pt"} <= files
    assert "model.safetensors" not in files  # the base is not copied into every checkpoint
    assert lora.adapter_base(straight.checkpoint) == babyai_model.resolve()
    block = ModelConfig(path=str(babyai_model), lora=LORA)
    model, _ = load_training_model(block, babyai_model, Path(straight.checkpoint))
    start = AutoModelForCausalLM.from_pretrained(babyai_model).state_dict()
    weights = model.state_dict()
    moved = [k for k in weights if ".lora_B." in k and float(weights[k].abs().max()) > 0]
    assert moved  # B starts at zero: the adapter learned
    for name, tensor in weights.items():
        if ".lora_" not in name:
            plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            assert torch.equal(tensor.cpu(), start[plain]), name  # the base did not move
    # the sampler generated with the adapter on: its log-probs are the learner's
    assert all(h["train/sampler_logprob_diff"] < 1e-4 for h in straight.history)


def test_a_lora_run_resumes_exactly(trained):
    straight, resumed, _ = trained
    assert resumed.resumed_from == 2
    keys = ["rollout/success_rate", "rollout/generated_tokens", "train/loss", "train/kl"]
    for step in (2, 3):
        for key in keys:
            assert resumed.history[step][key] == pytest.approx(
                straight.history[step][key], abs=1e-6
            ), (step, key)
    a = lora.load_file_weights(straight.checkpoint)
    b = lora.load_file_weights(resumed.checkpoint)
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_the_reference_is_the_start_model_with_the_adapter_off(trained, babyai_model):
    straight, _, batches = trained
    block = ModelConfig(path=str(babyai_model), lora=LORA)
    model, _ = load_training_model(block, babyai_model, Path(straight.checkpoint))
    trajectories = batches[-1].trainable[:4]
    start = AutoModelForCausalLM.from_pretrained(babyai_model).to(_device(model))
    off = _batch_logprobs(lora.AdapterOff(model), trajectories)
    on = _batch_logprobs(model, trajectories)
    torch.testing.assert_close(off, _batch_logprobs(start, trajectories), rtol=0, atol=1e-5)
    assert float((on - off).abs().max()) > 1e-3  # the adapter changes the policy
    assert all(p.requires_grad for n, p in model.named_parameters() if ".lora_" in n)
    assert straight.history[0]["train/kl"] == pytest.approx(0.0, abs=1e-7)  # B = 0 at first
    assert straight.history[-1]["train/kl"] > 0


def test_merge_writes_weights_any_tool_loads(trained, babyai_model, tmp_path):
    straight, _, batches = trained
    out = tmp_path / "merged"
    assert agentgym(["model", "merge", str(straight.checkpoint), "--out", str(out)]) == 0
    block = ModelConfig(path=str(babyai_model), lora=LORA)
    model, _ = load_training_model(block, babyai_model, Path(straight.checkpoint))
    merged = AutoModelForCausalLM.from_pretrained(out).to(_device(model))
    trajectories = batches[-1].trainable[:4]
    torch.testing.assert_close(
        _batch_logprobs(merged, trajectories),
        _batch_logprobs(model, trajectories),
        rtol=0,
        atol=1e-5,
    )
    # a weight sync sends the same merged weights (vLLM serves whole models)
    synced = dict(lora.full_weights(model))
    plain = merged.state_dict()
    assert synced.keys() == plain.keys()
    assert all(torch.allclose(synced[k].cpu(), plain[k].cpu(), atol=1e-6) for k in plain)
    assert agentgym(["model", "merge", str(babyai_model), "--out", str(tmp_path / "x")]) == 2


def test_sft_then_lora_grpo_then_dpo_then_eval_chain_through_adapters(tmp_path, babyai_model):
    """Each stage's adapter sits on the previous stage's merged weights, so each reference
    is the weights that stage started from."""
    raw = _raw(tmp_path, babyai_model, "chain", steps=2)
    raw["eval"] = {"num_tasks": 4, "max_turns": 2}
    raw["stages"] = [
        {
            "name": "sft",
            "type": "train",
            "algorithm": {
                "name": "sft",
                "expert": {"episodes": 6, "max_turns": 6},
                "batch_size": 4,
            },
        },
        {"name": "rl", "type": "train", "tracking": {"save_rollouts": True}},
        {"name": "dpo", "type": "train", "algorithm": {"name": "dpo", "pairs_from": "rl"}},
        {"name": "test", "type": "eval"},
    ]
    path = tmp_path / "chain.yaml"
    path.write_text(yaml.safe_dump(raw))
    host = PluginHost()
    results = run_pipeline(load_config(path, [], host.registry), host, show_progress=False)
    sft, rl, dpo, test = results
    assert lora.adapter_base(rl.model) == Path(sft.model).resolve()
    assert lora.adapter_base(dpo.model) == Path(rl.model).resolve()
    assert test.model == dpo.model and test.metrics["episodes"] == 4.0
    # a stage's first update starts at its reference (the adapter's B is zero): were the
    # reference another model (the untuned base), the first KL would not be 0, nor DPO's
    # first loss -log(sigmoid(0)) = log 2
    kl = _history(tmp_path / "chain", "chain/rl", "train/kl")
    dpo_loss = _history(tmp_path / "chain", "chain/dpo", "train/loss")
    assert len(kl) == 2 and len(dpo_loss) == 2
    assert kl[0] == pytest.approx(0.0, abs=1e-6)
    assert kl[-1] > 1e-6  # and the policy then moved away from it
    assert dpo_loss[0] == pytest.approx(math.log(2), abs=1e-5)
    assert dpo_loss[-1] != pytest.approx(math.log(2), abs=1e-5)


def _history(output_dir: Path, run_name: str, key: str) -> list[float]:
    """A metric's values, update by update, from the run's MLflow store."""
    from mlflow import MlflowClient

    from agentgym_core.tracking.mlflow_tracker import sqlite_uri

    client = MlflowClient(tracking_uri=sqlite_uri(output_dir / "mlflow.db"))
    experiments = [e.experiment_id for e in client.search_experiments()]
    (run,) = client.search_runs(experiments, f"tags.mlflow.runName = '{run_name}'")
    history = client.get_metric_history(run.info.run_id, key)
    return [m.value for m in sorted(history, key=lambda m: m.step)]


def test_the_rollout_copy_of_a_lora_learner_shares_its_frozen_base(babyai_model):
    """Rollouts ahead of the learner copy the adapter only; the base is the same tensors."""
    block = ModelConfig(path=str(babyai_model), lora=LORA)
    learner, _ = load_training_model(block, babyai_model, None)
    copied = rollout_copy(learner)
    pairs = list(zip(learner.named_parameters(), copied.named_parameters(), strict=True))
    frozen = [(a, b) for (name, a), (_, b) in pairs if not a.requires_grad]
    trained = [(a, b) for (name, a), (_, b) in pairs if a.requires_grad]
    assert frozen and trained
    assert all(a.data_ptr() == b.data_ptr() for a, b in frozen)  # shared, not copied
    assert all(a.data_ptr() != b.data_ptr() for a, b in trained)
    new_bytes = sum(b.numel() * b.element_size() for _, b in trained)
    base_bytes = sum(b.numel() * b.element_size() for _, b in frozen)
    assert new_bytes < base_bytes / 10
    with torch.no_grad():  # the learner trains on: the rollout copy keeps its weights
        for a, _ in trained:
            a.add_(1.0)
    assert all(not torch.equal(a, b) for a, b in trained)
    full, _ = load_training_model(ModelConfig(path=str(babyai_model)), babyai_model, None)
    full_copy = rollout_copy(full)  # full fine-tuning: every weight is the learner's to change
    assert all(
        a.data_ptr() != b.data_ptr()
        for a, b in zip(full.parameters(), full_copy.parameters(), strict=True)
    )


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_rollouts_ahead_of_a_lora_learner(tmp_path, babyai_model, worker):
    """Only the adapter travels to the rollout model; the process plays the thread's batches."""
    host = PluginHost()
    raw = _raw(tmp_path, babyai_model, worker, steps=3, max_staleness=1, rollout_worker=worker)
    result = _train(raw, host)
    assert [h["rollout/staleness"] for h in result.history] == [0.0, 1.0, 1.0]
    assert max(h["train/importance_weight_max"] for h in result.history[1:]) > 1.0 + 1e-4
    if worker == "process":
        thread = _train(_raw(tmp_path, babyai_model, "thread-twin", steps=3, max_staleness=1), host)
        for a, b in zip(thread.history, result.history, strict=True):
            assert a["train/loss"] == pytest.approx(b["train/loss"], abs=1e-5)


def test_an_evolve_stage_fine_tunes_lora_rounds(tmp_path, babyai_model):
    raw = _raw(tmp_path, babyai_model, "evolve", steps=2)
    raw["stages"] = [
        {
            "name": "evolve",
            "type": "evolve",
            "algorithm": {
                "name": "sft",
                "expert": {"episodes": 6, "max_turns": 6},
                "batch_size": 4,
            },
            "evolve": {"iterations": 1, "num_tasks": 4, "max_turns": 4},
        }
    ]
    path = tmp_path / "evolve.yaml"
    path.write_text(yaml.safe_dump(raw))
    host = PluginHost()
    [result] = run_pipeline(load_config(path, [], host.registry), host, show_progress=False)
    assert lora.is_adapter_checkpoint(result.model)
    assert lora.adapter_base(result.model) == babyai_model.resolve()  # restart: start


def test_lora_without_peft_names_the_install_command(monkeypatch, tmp_path, babyai_model):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a)
    )
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_raw(tmp_path, babyai_model, "c")))
    with pytest.raises(ConfigError) as raised:
        load_config(path, [], PluginHost().registry)
    assert "model.lora: LoRA needs peft" in str(raised.value)
    assert "pip install 'agentgym-core[lora]'" in str(raised.value)


def test_top_layers_adapts_the_last_layers_only_and_backward_stops_under_them(
    tmp_path, babyai_model
):
    """`top_layers: 1` on a 2-layer model: the adapter sits on layer 1 alone, nothing under it
    is in the autograd graph, and the run trains, samples as it scores, resumes and merges."""
    top = {**LORA, "top_layers": 1}
    raw = _raw(tmp_path, babyai_model, "top", steps=2)
    raw["model"]["lora"] = top
    run = _train(raw, PluginHost())
    assert all(h["train/sampler_logprob_diff"] < 1e-4 for h in run.history)
    saved = lora.load_file_weights(run.checkpoint)
    assert saved and all(".layers.1." in name for name in saved)
    assert any(".lora_B." in k and float(v.abs().max()) > 0 for k, v in saved.items())

    block = ModelConfig(path=str(babyai_model), lora=top)
    model, _ = load_training_model(block, babyai_model, Path(run.checkpoint))
    layers = model.get_base_model().model.layers
    needs_grad: dict[int, bool] = {}
    for index, layer in enumerate(layers):
        layer.register_forward_hook(
            lambda _m, _i, out, index=index: needs_grad.__setitem__(
                index, (out[0] if isinstance(out, tuple) else out).requires_grad
            )
        )
    model(input_ids=torch.tensor([[5, 6, 7]], device=_device(model))).logits.sum().backward()
    assert needs_grad == {0: False, 1: True}

    out = tmp_path / "merged"
    assert agentgym(["model", "merge", str(run.checkpoint), "--out", str(out)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(out).to(_device(model))
    ids = torch.tensor([[5, 6, 7, 8]], device=_device(model))
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, model(input_ids=ids).logits)

    raw["model"]["lora"] = {**LORA, "top_layers": 3}
    raw["run"]["output_dir"] = str(tmp_path / "too-deep")
    with pytest.raises(ConfigError) as raised:
        _train(raw, PluginHost())
    message = str(raised.value)
    assert "model.lora.top_layers: 3 layers asked for, but the model at" in message
    assert "has 2: set at most 2" in message
