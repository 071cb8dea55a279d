"""Device placement and attention kernels: one function says where things go.

`distributed.device()` is accelerate's device for the rank: `cuda:<local rank>`
under `accelerate launch` on GPUs, `cpu` without one (also in a CPU launch that
sets LOCAL_RANK). Nothing in the package names a CUDA device by hand.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import agentgym_core
from agentgym_core import distributed
from agentgym_core.config.errors import ConfigError
from agentgym_core.config.schema import ModelConfig
from agentgym_core.run.components import attention_problem, load_configured_model, load_model

ROOT = Path(agentgym_core.__file__).resolve().parents[1]
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only machine")


@no_cuda
def test_device_is_the_cpu_without_a_gpu():
    assert distributed.device() == torch.device("cpu")


def test_load_model_places_weights_on_the_ranks_device(tiny_model_dir, monkeypatch):
    # whatever device() answers is where the weights go ("meta" stands in for a rank's GPU)
    monkeypatch.setattr(distributed, "device", lambda: torch.device("meta"))
    model, _ = load_model(tiny_model_dir)
    assert {p.device.type for p in model.parameters()} == {"meta"}


@no_cuda
def test_two_cpu_ranks_place_on_the_cpu(tmp_path, tiny_model_dir):
    """A 2-process CPU launch sets LOCAL_RANK; each rank's device is still the CPU."""
    script = tmp_path / "where.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, os, sys
            from agentgym_core import distributed
            from agentgym_core.run.components import load_model

            model, _ = load_model({str(tiny_model_dir)!r})
            row = {{
                "rank": distributed.rank(),
                "local_rank": os.environ.get("LOCAL_RANK"),
                "device": str(distributed.device()),
                "weights": str(next(model.parameters()).device),
            }}
            with open(sys.argv[1] + f"/rank{{row['rank']}}.json", "w") as out:
                json.dump(row, out)
            """
        )
    )
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH")] if p)
    command = [
        *(sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu"),
        *("--num_processes", "2", "--num_machines", "1", "--main_process_port", str(port)),
        *("--mixed_precision", "no", "--dynamo_backend", "no", str(script), str(tmp_path)),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    rows = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [row["local_rank"] for row in rows] == ["0", "1"]
    for row in rows:
        assert torch.device(row["device"]).type == "cpu"
        assert torch.device(row["weights"]).type == "cpu"


# Where code picks a CUDA device by hand; "cuda" as a dict key (the checkpoint's RNG
# states) is no device.
HARD_CODED = re.compile(
    r"""\.to\(\s*["']cuda"""
    r"""|device\s*=\s*["']cuda"""
    r"""|torch\.device\(\s*["']cuda"""
    r"""|autocast\(\s*(device_type\s*=\s*)?["']cuda"""
    r"""|["']cuda:\d*["']"""
    r"|\.cuda\("
    r"|torch\.cuda\.(current_device|set_device)\("
    r"""|device_map\s*=\s*["']auto"""
)


def _package_sources() -> list[Path]:
    plugins = [p for p in (ROOT / "plugins").glob("*/*/*") if p.is_dir() and p.name != "tests"]
    files = list((ROOT / "agentgym_core").rglob("*.py"))
    for package in plugins:
        files += package.rglob("*.py")
    return sorted(files)


def test_nothing_in_the_package_hard_codes_a_cuda_device():
    sources = _package_sources()
    assert any(p.name == "distributed.py" for p in sources)
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if HARD_CODED.search(line)
    ]
    assert not offenders, "use agentgym_core.distributed.device():\n" + "\n".join(offenders)


def test_the_grep_finds_what_it_is_for():
    found = [
        'model.to("cuda")',
        "x.cuda()",
        "torch.zeros(3, device='cuda')",
        'torch.device("cuda", 0)',
        'DEVICE = "cuda:0"',
        'torch.autocast(device_type="cuda", dtype=torch.bfloat16)',
        "torch.cuda.set_device(1)",
    ]
    for line in found:
        assert HARD_CODED.search(line), line
    for line in ('{"cuda": torch.cuda.get_rng_state_all()}', 'state["rng"].get("cuda")'):
        assert not HARD_CODED.search(line), line


# -- model.attn_implementation ------------------------------------------------------------


@pytest.mark.parametrize("kernel", ["sdpa", "eager"])
def test_attention_kernels_reach_the_model(tiny_model_dir, kernel):
    model, _ = load_configured_model(
        ModelConfig(path=str(tiny_model_dir), attn_implementation=kernel)
    )
    assert model.config._attn_implementation == kernel


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("flash_attn") is not None,
    reason="flash-attn is installed here",
)
def test_missing_flash_attn_names_the_key_and_the_install(tiny_model_dir):
    block = ModelConfig(path=str(tiny_model_dir), attn_implementation="flash_attention_2")
    with pytest.raises(ConfigError) as raised:
        load_configured_model(block)
    message = str(raised.value)
    assert "model.attn_implementation: 'flash_attention_2' needs the flash-attn package" in message
    assert "pip install flash-attn" in message and "'sdpa'" in message


def test_flash_attention_without_a_gpu_says_so():
    error = ImportError(
        "FlashAttention2 has been toggled on, but it cannot be used due to the following "
        "error: FlashAttention2 is not available on CPU. Please make sure ..."
    )
    message = attention_problem("flash_attention_2", error)
    assert message.startswith("'flash_attention_2' runs on CUDA GPUs only")
    assert "'sdpa'" in message


def test_an_unknown_kernel_lists_the_tested_ones(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"model\.attn_implementation: 'bogus': .*sdpa, "):
        load_configured_model(ModelConfig(path=str(tiny_model_dir), attn_implementation="bogus"))
