"""The GPU check (`benchmarks/gpu_check.py`) and the tests that need a GPU.

The smoke test runs on any machine: the whole check on a tiny model on the
CPU, so the plumbing is tested where CI runs. Tests marked `gpu` need CUDA and
skip without it; `make test-gpu` runs them on a GPU machine (docs/gpu.md).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import agentgym_core

ROOT = Path(agentgym_core.__file__).resolve().parents[1]
CHECK = ROOT / "benchmarks" / "gpu_check.py"
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU: make test-gpu"
)


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", CHECK)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("gpu_check", None)


# -- on any machine -----------------------------------------------------------------------


def test_the_smoke_check_runs_every_case_and_writes_its_summary(tmp_path):
    out = tmp_path / "summary.json"
    command = [sys.executable, str(CHECK), "--smoke", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "train tok/s" in done.stdout and "MFU" in done.stdout  # the table
    result = json.loads(out.read_text())
    assert result["smoke"] is True and result["mlflow_imported"] is False
    for key in ("name", "torch", "transformers", "accelerate", "peft", "peak_bf16_tflops"):
        assert key in result["machine"]
    cases = {row["case"]: row for row in result["cases"]}
    lora_cases = ["tiny lora", "tiny lora, bf16 adapter"]
    fsdp = "tiny full fsdp2 (1 process)"
    assert list(cases) == [
        *("tiny full", "tiny full, chunked head", *lora_cases),
        *(fsdp, f"{fsdp}, chunked head"),
    ]
    for name, row in cases.items():
        if row["status"].startswith("skipped"):
            assert name in lora_cases, row  # only before model.lora exists
            continue
        assert row["status"] == "ok", row
        assert row["train_tokens_per_s"] > 0 and row["finite"]
        for key in ("mfu", "peak_memory_gib", "update_s", "params", "attention"):
            assert key in row, key
        assert torch.device(row["weights_on"]).type == torch.device(row["device"]).type
    assert cases["tiny full"]["dtype"] == "bfloat16"
    trained = {name: cases[name].get("trained_dtype") for name in ["tiny full", *lora_cases]}
    assert trained == {
        "tiny full": "bfloat16",
        "tiny lora": "float32",
        "tiny lora, bf16 adapter": "bfloat16",
    }
    assert cases["tiny full"]["gen_tokens_per_s"] > 0
    assert cases["tiny full fsdp2 (1 process)"]["sharded"] is True
    # the output head in chunks: the same update, up to bf16 rounding of the head's gradient
    for plain in ("tiny full", fsdp):
        chunked = cases[f"{plain}, chunked head"]
        assert chunked["logprob_chunk_tokens"] == 5 and cases[plain]["logprob_chunk_tokens"] is None
        assert chunked["grad_norm"] == pytest.approx(cases[plain]["grad_norm"], rel=1e-3)
        assert chunked["sharded"] is cases[plain]["sharded"]
    assert set(cases["tiny full"]["gen_s"]) == {"prefill", "decode", "sampling", "kv_cache"}


def _check_rows(tmp_path, *options: str) -> tuple[list[dict], str]:
    """The rows and printout of `gpu_check.py --smoke OPTIONS` (a subprocess that must succeed)."""
    out = tmp_path / "check.json"
    command = [sys.executable, str(CHECK), "--smoke", *options, "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return json.loads(out.read_text())["cases"], done.stdout


def test_the_generation_only_check_times_the_batch_as_often_as_asked(tmp_path):
    rows, _ = _check_rows(tmp_path, "--generation-only", "--repeats", "3")
    assert [row["case"] for row in rows] == [f"tiny generation {n}" for n in (1, 2, 3)]
    for row in rows:
        assert row["gen_tokens_per_s"] > 0 and row["gen_s"]["decode"] > 0, row
        assert "train_tokens_per_s" not in row


def test_the_generation_check_interleaves_the_plain_and_the_compiled_decode_step(tmp_path):
    rows, _ = _check_rows(tmp_path, "--generation-only", "--compile-decode", "--repeats", "2")
    arms = ["plain", "compiled"]
    assert [row["case"] for row in rows] == [
        f"tiny generation {n} {a}" for n in (1, 2) for a in arms
    ]
    for row in rows:
        assert row["status"] == "ok" and row["gen_tokens_per_s"] > 0, row
        assert row["compile_decode"] is row["case"].endswith("compiled")


def test_the_packing_check_interleaves_its_arms(tmp_path):
    rows, printed = _check_rows(tmp_path, "--packing-only", "--repeats", "2")
    arms = ["padded", "shared-flex", "shared-sdpa"]
    assert [row["case"] for row in rows] == [f"tiny {a} {n}" for n in (1, 2) for a in arms]
    for row in rows:
        if row["case"].startswith("tiny shared-flex") and not torch.cuda.is_available():
            assert row["status"].startswith("skipped: flex_attention has no backward"), row
            continue
        assert row["status"] == "ok" and row["train_tokens_per_s"] > 0, row
        assert row["rows"] == row["case"].split()[1].split("-")[0], row
        assert 0 <= row["padding_fraction"] < 1 and row["gen_tokens_per_s"] is None
    assert "padding" in printed and "gen tok/s" not in printed


def test_varied_episodes_share_their_groups_prompt_and_end_when_they_end(gpu_check):
    shape = gpu_check.SHAPES["tiny"]
    batch = gpu_check.synthetic_batch(shape, 100, 0, varied=True).trajectories
    prompts = [tuple(t.token_ids[: shape.prompt]) for t in batch]
    assert all(prompts[i] == prompts[i - i % 4] for i in range(len(batch)))
    assert len(set(prompts)) == len(batch) // 4
    turn = shape.action + shape.observation
    assert {(len(t.token_ids) - shape.prompt) // turn for t in batch} == {1, 2}
    with pytest.raises(ValueError, match=r"--packings: unknown \['ring'\]"):
        gpu_check.check_packing(["tiny"], ["padded", "ring"], 1, Path("unused"))


def test_the_card_table_and_the_plan(gpu_check):
    assert gpu_check.peak_bf16_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert gpu_check.peak_bf16_flops("NVIDIA H100 PCIe") == 756e12
    assert gpu_check.peak_bf16_flops("NVIDIA H200") == 989e12
    assert gpu_check.peak_bf16_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert gpu_check.peak_bf16_flops("NVIDIA L4") == 121e12
    assert gpu_check.peak_bf16_flops("NVIDIA L40S") == 362e12
    assert gpu_check.peak_bf16_flops("Tesla T4") is None
    seven, half = gpu_check.SHAPES["7b"], gpu_check.SHAPES["0.5b"]
    assert 7.0e9 < gpu_check._param_estimate(seven) < 8.0e9
    assert 0.45e9 < gpu_check._param_estimate(half) < 0.55e9
    assert gpu_check.full_finetune_fits(seven, 79.2).startswith("skipped")
    assert gpu_check.full_finetune_fits(seven, 139.8).startswith("skipped")  # 20 B a weight
    assert gpu_check.full_finetune_fits(seven, 192.0) is None
    assert gpu_check.full_finetune_fits(half, 79.2) is None


def test_the_plan_runs_the_cases_asked_in_their_order(gpu_check):
    info = {"memory_gib": 79.2}
    names = [name for name, _, _ in gpu_check.plan(["tiny", "7b"], info, fsdp=True)]
    assert names == [
        *("tiny full", "tiny full, chunked head", "tiny lora", "tiny lora, bf16 adapter"),
        *("tiny full fsdp2 (1 process)", "tiny full fsdp2 (1 process), chunked head"),
        *("7b full", "7b full, chunked head", "7b lora", "7b lora, bf16 adapter"),
    ]  # FSDP2 runs at the small sizes only
    reversed_lora = gpu_check.plan(["0.5b"], info, fsdp=True, cases=["lora-bf16", "lora"])
    assert [name for name, _, _ in reversed_lora] == ["0.5b lora, bf16 adapter", "0.5b lora"]
    with pytest.raises(
        ValueError, match=r"--cases: unknown \['qlora'\]; known: full, chunked, lora"
    ):
        gpu_check.plan(["tiny"], info, fsdp=False, cases=["lora", "qlora"])


def test_the_summary_goes_where_it_is_asked(gpu_check, monkeypatch, tmp_path):
    monkeypatch.delenv("AGENTGYM_GPU_CHECK_JSON", raising=False)
    monkeypatch.delenv("OUT", raising=False)
    assert gpu_check.json_path(None) == Path("runs") / "gpu_check.json"
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_check.json_path(None) == tmp_path / "gpu_check.json"
    monkeypatch.setenv("AGENTGYM_GPU_CHECK_JSON", str(tmp_path / "a.json"))
    assert gpu_check.json_path(None) == tmp_path / "a.json"
    assert gpu_check.json_path("b.json") == Path("b.json")


# -- on a GPU (make test-gpu) ------------------------------------------------------------


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("lora", [None, "float32", "model"], ids=["full", "lora", "lora-bf16"])
def test_a_bf16_update_and_generation_run_on_the_gpu(gpu_check, tmp_path, lora):
    if lora and gpu_check.lora_available():
        pytest.skip(gpu_check.lora_available())
    shape = gpu_check.SHAPES["tiny"]
    folder = gpu_check.build_model(shape, tmp_path / "tiny")
    row = gpu_check.run_case("t", folder, shape, lora=lora, attn="sdpa", peak=None)
    assert row["status"] == "ok", row
    assert torch.device(row["weights_on"]).type == "cuda" and row["dtype"] == "bfloat16"
    assert row["peak_memory_gib"] > 0 and row["gen_tokens_per_s"] > 0


@pytest.mark.gpu
@needs_cuda
def test_shared_rows_train_under_flex_attention_on_the_gpu(gpu_check, tmp_path):
    folder = gpu_check.build_model(gpu_check.SHAPES["tiny"], tmp_path / "tiny")
    shape = gpu_check.SHAPES["tiny"]
    row = gpu_check.run_case(
        "t", folder, shape, lora=None, attn="flex_attention", peak=None, varied=True, generate=False
    )
    assert row["status"] == "ok", row
    assert row["attention"] == "flex_attention" and row["rows"] == "shared"  # packing: auto


@pytest.mark.gpu
@needs_cuda
def test_the_device_is_the_ranks_gpu(tiny_model_dir):
    from accelerate import Accelerator

    from agentgym_core import distributed
    from agentgym_core.run.components import load_model

    assert distributed.device().type == "cuda"
    model, _ = load_model(tiny_model_dir, "bfloat16")
    assert next(model.parameters()).device.type == "cuda"
    assert Accelerator().device == distributed.device()


@pytest.mark.gpu
@needs_cuda
def test_one_fsdp2_process_trains(gpu_check, tmp_path):
    folder = gpu_check.build_model(gpu_check.SHAPES["tiny"], tmp_path / "tiny")
    row = gpu_check.launch_fsdp(folder, "tiny", "sdpa", timeout=300)
    assert row["status"] == "ok", row
    assert row["sharded"] is True and row["distributed_type"] == "FSDP"


@pytest.mark.gpu
@needs_cuda
@pytest.mark.skipif(
    importlib.util.find_spec("flash_attn") is None, reason="flash-attn is not installed"
)
def test_flash_attention_2_matches_sdpa(tiny_model_dir):
    from agentgym_core.run.components import load_model

    ids = torch.randint(3, 200, (2, 48))
    logits = {}
    for kernel in ("sdpa", "flash_attention_2"):
        model, _ = load_model(tiny_model_dir, "bfloat16", attn_implementation=kernel)
        with torch.no_grad():
            logits[kernel] = model(input_ids=ids.to(model.device)).logits.float()
    assert torch.allclose(logits["sdpa"], logits["flash_attention_2"], atol=5e-2, rtol=0)


@pytest.mark.gpu
@needs_cuda
def test_the_output_head_in_chunks_on_the_gpu():
    """Qwen2.5's vocabulary in bf16 on the GPU: the values and gradients of the plain path,
    and a far lower peak of GPU memory over the forward and backward pass."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentgym_core.learner.forward import policy_forward
    from agentgym_core.learner.packing import pack
    from agentgym_core.types import Trajectory

    vocab = 151936
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).to("cuda", torch.bfloat16)
    ids = torch.randint(3, vocab, (4, 600)).tolist()
    mask = [0] * 88 + ([1] * 64 + [0] * 64) * 4  # 256 agent tokens per row, 1024 in all
    trajs = [
        Trajectory(task_id=0, group=0, token_ids=row, loss_mask=list(mask), logprobs=[0.0] * 600)
        for row in ids
    ]
    (mb,) = pack(trajs, row_tokens=None, micro_batch_tokens=1 << 20, share_rows=False)
    weights = torch.linspace(-1, 1, mb.mask.numel(), device="cuda").view(mb.mask.shape)

    def run(chunk):
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        logprobs, entropy, _ = policy_forward(model, mb, 1.0, chunk_tokens=chunk)
        ((weights * logprobs).sum() + 0.1 * entropy.sum()).backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        grads = {n: p.grad.float() for n, p in model.named_parameters()}
        return logprobs.detach(), entropy.detach(), grads, peak

    plain, chunked = run(None), run(128)
    assert torch.allclose(chunked[0], plain[0], atol=1e-5)
    assert torch.allclose(chunked[1], plain[1], atol=1e-5)
    for name, grad in plain[2].items():  # bf16 gradients of the head sum 8 chunks' parts
        assert (chunked[2][name] - grad).abs().max() <= 2**-6 * grad.abs().max() + 1e-5, name
    # plain: several float32 [1024, vocab] tensors (622 MB each); chunked: [128, vocab] ones
    logits = 1024 * vocab * 4
    assert plain[3] > 2 * logits and chunked[3] < plain[3] / 4, (plain[3], chunked[3])
