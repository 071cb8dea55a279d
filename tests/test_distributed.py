"""Data-parallel training under `accelerate launch`: two CPU ranks train as one process would.

The launch test runs `agentgym train` in two processes (gloo) and compares
with one process on the same config: both ranks must hold identical weights,
and weights and metrics must match the single-process run. Rollouts are split
by episode (per-request seeds make them rank-independent), and the update by
trajectory; a mini-batch of one trajectory leaves a rank without work on purpose.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

import agentgym_core
from agentgym_core import distributed
from agentgym_core.config.load import load_config
from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model
from agentgym_core.plugins import PluginHost
from agentgym_core.run.kinds import run_stage

# -- the split and gather helpers (one process) -------------------------------------------


def test_chunks_cover_the_list_in_order():
    items = list(range(11))
    for count in (1, 2, 3, 4, 11, 12):
        parts = [distributed.chunk(items, index, count) for index in range(count)]
        assert sum(parts, []) == items
        assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_one_process_is_a_no_op():
    assert distributed.world_size() == 1 and distributed.rank() == 0 and distributed.is_main()
    assert distributed.shard([3, 1, 2]) == [3, 1, 2]
    assert distributed.gather([3, 1, 2]) == [3, 1, 2]
    assert distributed.sum_over_ranks({"a": 1.5}) == {"a": 1.5}
    assert distributed.max_over_ranks(4) == 4


def test_token_split_is_balanced_and_complete():
    lengths = [400, 90, 380, 120, 350, 100, 60]
    parts = distributed.split_by_tokens(lengths, 2)
    assert sorted(sum(parts, [])) == list(range(len(lengths)))
    loads = [sum(lengths[i] for i in part) for part in parts]
    assert abs(loads[0] - loads[1]) <= max(lengths)
    assert distributed.split_by_tokens(lengths, 1) == [list(range(len(lengths)))]
    assert distributed.split_by_tokens([5], 3) == [[0], [], []]


# -- the example launch configs ----------------------------------------------------------

ACCELERATE_CONFIGS = Path(__file__).resolve().parents[1] / "configs" / "accelerate"


@pytest.mark.parametrize(
    "path", sorted(ACCELERATE_CONFIGS.glob("*.yaml")), ids=lambda path: path.name
)
def test_accelerate_configs_load_and_open_with_their_command(path):
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(path))
    assert config.num_processes == 8 * config.num_machines
    if config.distributed_type == "FSDP":
        assert config.fsdp_config["fsdp_version"] == 2
    first = path.read_text().splitlines()[0]
    command = f"# accelerate launch --config_file configs/accelerate/{path.name} "
    assert first.startswith(command) and " -m agentgym_core.cli train configs/" in first
    assert (ACCELERATE_CONFIGS.parent / first.split()[-1].removeprefix("configs/")).is_file()


# -- two ranks against one process --------------------------------------------------------

ENV = {"name": "babyai", "levels": ["GoToObj"], "list_actions": False}


@pytest.fixture(scope="module")
def gotoobj_model(tmp_path_factory) -> Path:
    pytest.importorskip("agentgym_env_babyai")
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    env = BabyAIEnv(BabyAIConfig(levels=ENV["levels"], list_actions=False))
    texts = env_corpus(env, env.tasks("train")[:60], max_turns=4)
    return init_model(texts, tmp_path_factory.mktemp("gotoobj"), TinyModelConfig(vocab_size=400))


def _config(folder: Path, model: Path) -> Path:
    """3 tasks x 3 samples in 5 mini-batches: the last holds 1 trajectory, one rank none."""
    raw = {
        "run": {"name": "dist", "output_dir": str(folder / "single"), "seed": 3},
        "model": {"path": str(model)},
        "env": ENV,
        "algorithm": {"name": "grpo", "kl_coef": 0.05},  # a reference model: sharded scoring
        "scheduler": {"name": "fixed", "max_turns": 2},
        "rollout": {"max_context_tokens": 768, "concurrency": 16},
        "trainer": {
            "steps": 2,
            "tasks_per_step": 3,
            "group_size": 3,
            "lr": 1e-3,
            "mini_batches": 5,  # recomputed old log-probs, 5 optimizer steps per update
            "micro_batch_tokens": 400,  # about one trajectory per micro-batch
            "checkpoint_every": 1,
        },
        "tracking": {"log_trajectories": 0},
    }
    path = folder / "dist.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


HERE = Path(__file__).resolve().parent
LAUNCHERS = {
    "ddp": ("--multi_gpu", "-m", "agentgym_core.cli"),
    # accelerate turns FSDP on for GPUs only; fsdp_cpu.py lets torch's FSDP2 run on CPU ranks
    "fsdp": (
        *("--use_fsdp", "--fsdp_version", "2"),
        *("--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"),
        str(HERE / "fsdp_cpu.py"),
    ),
}


def _launch(config: Path, mode: str, *overrides: str) -> None:
    """`agentgym train` in two CPU processes over gloo, importing this checkout's agentgym_core."""
    root = Path(agentgym_core.__file__).resolve().parents[1]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(root), env.get("PYTHONPATH")] if p)
    command = [
        *(sys.executable, "-m", "accelerate.commands.launch"),
        *("--num_processes", "2", "--num_machines", "1"),
        *("--mixed_precision", "no", "--dynamo_backend", "no"),
        *("--main_process_port", str(_free_port())),
        *LAUNCHERS[mode],
        *("train", str(config), *overrides, "--no-progress"),
    ]
    log = config.parent / f"launch-{len(list(config.parent.glob('launch-*.log')))}.log"
    with log.open("w") as sink, subprocess.Popen(command, env=env, stdout=sink, stderr=sink) as run:
        try:
            run.wait(timeout=180)
        except subprocess.TimeoutExpired:
            run.terminate()  # the launcher passes SIGTERM on to the ranks it started
            run.wait(timeout=60)
            pytest.fail(f"ranks still running after 180 s (an unpaired collective?)\n{_tail(log)}")
    assert run.returncode == 0, _tail(log)


def _tail(log: Path) -> str:
    return log.read_text()[-6000:]


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return AutoModelForCausalLM.from_pretrained(checkpoint).state_dict()


def _state(checkpoint: Path) -> dict:
    return torch.load(checkpoint / "trainer_state.pt", weights_only=False)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, gotoobj_model):
    """The config, and the result of training on it in this process."""
    config = _config(tmp_path_factory.mktemp("dist"), gotoobj_model)
    host = PluginHost()
    return config, run_stage(load_config(config, [], host.registry), host, show_progress=False)


@pytest.mark.parametrize("mode", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])
def test_two_ranks_train_and_resume_as_one_process(tmp_path, one_process, mode, request):
    if mode == "ddp":  # exactness must not need a quiet machine; one mode shows it (CI's time)
        request.getfixturevalue("cpu_contention")
    config, single = one_process
    out = tmp_path / "two"
    _launch(config, mode, f"run.output_dir={out}", "trainer.steps=1")  # stop after one update ...
    _launch(config, mode, f"run.output_dir={out}")  # ... and resume: every rank loads step 1
    checkpoints = sorted((out / "checkpoints").iterdir())
    assert [c.name for c in checkpoints] == ["step-000001", "step-000002"]

    for checkpoint in checkpoints:
        ranks = _state(checkpoint)["extra"]["ranks"]
        assert ranks["world_size"] == 2
        rank0, rank1 = ranks["fingerprints"]
        assert rank0 == rank1  # bit-identical weights on both ranks
        model = AutoModelForCausalLM.from_pretrained(checkpoint)
        assert distributed.fingerprint(model) == pytest.approx(rank0, rel=1e-9, abs=1e-9)

    final = checkpoints[-1]
    assert _state(final)["history"][0]["rollout/episodes"] == 9.0  # the full batch, not a shard
    a, b = _weights(single.checkpoint), _weights(final)
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 1e-5, worst
    # Adam's step hides a uniformly scaled gradient: the reduced gradient's norm does not
    keys = ["rollout/success_rate", "train/loss", "train/grad_norm", "train/kl", "train/entropy"]
    for mine, theirs in zip(single.history, _state(final)["history"], strict=True):
        for key in keys:
            assert theirs[key] == pytest.approx(mine[key], rel=1e-4, abs=1e-7), key


def test_two_ranks_train_a_lora_adapter_as_one_process(tmp_path, gotoobj_model):
    """model.lora under DDP: both ranks hold the same adapter, that of one process."""
    from agentgym_core.config.schema import ModelConfig
    from agentgym_core.run.runtime import load_training_model

    config = _config(tmp_path, gotoobj_model)
    lora = "model.lora={r: 4, alpha: 8}"
    host = PluginHost()
    single = run_stage(load_config(config, [lora], host.registry), host, show_progress=False)
    out = tmp_path / "two"
    _launch(config, "ddp", lora, f"run.output_dir={out}")
    final = sorted((out / "checkpoints").iterdir())[-1]
    assert (final / "adapter_model.safetensors").is_file()
    rank0, rank1 = _state(final)["extra"]["ranks"]["fingerprints"]
    assert rank0 == rank1  # bit-identical adapters (and bases) on both ranks
    block = ModelConfig(path=str(gotoobj_model), lora={"r": 4, "alpha": 8})
    mine, _ = load_training_model(block, gotoobj_model, single.checkpoint)
    theirs, _ = load_training_model(block, gotoobj_model, final)
    a, b = mine.state_dict(), theirs.state_dict()
    assert any("lora_B" in k and float(a[k].abs().max()) > 0 for k in a)  # the adapter trained
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst < 1e-5, worst


@pytest.mark.slow
def test_two_ranks_run_an_offline_pipeline_as_one_process(tmp_path, gotoobj_model):
    """SFT on expert episodes, sampled eval episodes saved, DPO on their pairs."""
    from agentgym_core.run.pipeline import run_pipeline
    from agentgym_core.run.saved_rollouts import read_rollouts

    sft = {"name": "sft", "expert": {"episodes": 20, "max_turns": 6}, "batch_size": 5}
    raw = {
        "run": {"name": "pipe", "output_dir": str(tmp_path / "single"), "seed": 1},
        "model": {"path": str(gotoobj_model)},
        "env": ENV,
        "rollout": {"max_context_tokens": 768, "concurrency": 16},
        "trainer": {"lr": 3e-3, "checkpoint_every": 0, "micro_batch_tokens": 600},
        "eval": {"num_tasks": 6, "max_turns": 3, "greedy": True},
        "tracking": {"log_trajectories": 0},
        "stages": [
            {"name": "sft", "type": "train", "algorithm": sft, "trainer": {"steps": 3}},
            {
                "name": "sample",
                "type": "eval",  # each rank plays its share; the main process saves them all
                "eval": {"split": "train", "num_tasks": 5, "k": 4, "greedy": False},
                "tracking": {"save_rollouts": True},
            },
            {
                "name": "dpo",
                "type": "train",
                "algorithm": {"name": "dpo", "pairs_from": "sample", "batch_size": 3},
                "trainer": {"steps": 2, "lr": 5e-5},
            },
        ],
    }
    config = tmp_path / "pipe.yaml"
    config.write_text(yaml.safe_dump(raw))
    host = PluginHost()
    single = run_pipeline(load_config(config, [], host.registry), host, show_progress=False)
    _launch(config, "ddp", f"run.output_dir={tmp_path / 'two'}")

    played = [read_rollouts(tmp_path / run / "sample" / "rollouts") for run in ("single", "two")]
    assert [t.token_ids for t in played[0]] == [t.token_ids for t in played[1]]
    final = tmp_path / "two" / "dpo" / "checkpoints" / "step-000002"
    ranks = _state(final)["extra"]["ranks"]
    assert ranks["fingerprints"][0] == ranks["fingerprints"][1]
    for stage, steps in (("sft", 3), ("dpo", 2)):
        path = Path("checkpoints") / f"step-{steps:06d}"
        mine = _state(tmp_path / "single" / stage / path)["history"]
        theirs = _state(tmp_path / "two" / stage / path)["history"]
        for one, two in zip(mine, theirs, strict=True):
            for key in ("train/loss", "train/grad_norm"):
                assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-7), (stage, key)
    a, b = _weights(single[-1].model), _weights(final)
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-5
