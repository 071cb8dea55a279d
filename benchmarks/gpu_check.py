"""The GPU check: what agentgym does on one GPU, in one run, with the figures to judge it by.

On a Qwen2.5-0.5B-shaped model (its config, random weights, a tokenizer trained
here: nothing from a hub) and, where the card's memory allows, on Qwen2.5-7B's
shapes, it runs:

- a bf16 learner update with gradient checkpointing, full fine-tuning and LoRA,
  opened through the config and stage API (`AgentGymConfig` -> `runtime.open_learner`,
  so it follows the run's own model loading, LoRA and optimizer) on synthetic
  multi-turn GRPO trajectories: tokens per second, model FLOPs utilisation (MFU)
  and peak GPU memory;
- `hf` generation (`HFPolicy`) of one batch of episodes with the trained model;
- the full fine-tuning update again in one FSDP2 process (`accelerate launch --use_fsdp`);
- where models land (`distributed.device()`) and which attention kernel ran.

`--packing-only` times the update alone on trajectories of 1 to `turns` turns (episodes
end when they end), with several trajectories to a row under flex_attention's block
mask against one per padded row under sdpa (and shared rows under sdpa's dense mask),
the arms interleaved in one process (`PACKINGS`).

MFU = 6 x (parameters x tokens) / seconds / the card's peak dense bf16 FLOP/s, where
the body's parameters count every token and the output head only the positions it
runs on (agent tokens: the learner never builds the other logits). For LoRA the
6x convention overstates the work (frozen weights get no weight gradient).

One table is printed at the end and written as JSON: `--json`, else
`$AGENTGYM_GPU_CHECK_JSON`, else `$OUT/gpu_check.json`, else `runs/gpu_check.json`.
`--smoke` runs every part on a tiny model on whatever device there is (the CPU
suite runs it: tests/test_gpu.py). On a GPU machine run it through
`scripts/gpu_check.sh` (docs/gpu.md). Exit status 1 when a case failed.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import platform
import random
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# Peak dense bf16 tensor-core FLOP/s (no sparsity), from the vendors' data sheets;
# the first key found in `torch.cuda.get_device_name()` wins.
PEAK_BF16 = [
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM ("NVIDIA H100 80GB HBM3")
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
]


@dataclass(frozen=True)
class Shape:
    """A model's shape and the work each case gives it."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int | None  # None: the trained tokenizer's size
    tied: bool
    trajectories: int = 64
    prompt: int = 256
    turns: int = 8
    action: int = 32
    observation: int = 64
    micro_batch_tokens: int = 16384
    steps: int = 3
    gen_batch: int = 64
    gen_prompt: int = 512
    gen_tokens: int = 128
    head_chunk: int = 1024  # agent tokens per output-head chunk in the chunked-head cases

    @property
    def length(self) -> int:
        """Tokens of one synthetic trajectory."""
        return self.prompt + self.turns * (self.action + self.observation)


SHAPES = {
    "tiny": Shape(
        "tiny", 64, 128, 2, 4, 2, None, True, trajectories=8, prompt=16, turns=2, action=8,
        observation=8, micro_batch_tokens=256, steps=1, gen_batch=4, gen_prompt=16, gen_tokens=8,
        head_chunk=5,
    ),
    "0.5b": Shape("qwen2.5-0.5b", 896, 4864, 24, 14, 2, 151936, True),
    "7b": Shape(
        "qwen2.5-7b", 3584, 18944, 28, 28, 4, 152064, False, trajectories=32,
        micro_batch_tokens=8192, steps=2, gen_batch=32,
    ),
}  # fmt: skip

CORPUS = [
    "go to the red ball",
    "pick up the blue key and open the door",
    "turn left, turn right, move forward",
    "You see a wall on your left and a green box in front of you.",
    "Craft 1 stick using 2 planks. Inventory: [oak planks] (4)",
    "search[agent benchmarks] click[Buy Now] think[the price is too high]",
] * 20


# -- the machine -------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """The card, its peak bf16 FLOP/s, and the versions that ran."""
    import accelerate
    import transformers

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "peft": _version("peft"),
        "flash_attn": _version("flash_attn"),
        "cuda": torch.cuda.is_available(),
        "name": "cpu",
        "memory_gib": None,
        "peak_bf16_tflops": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["name"] = torch.cuda.get_device_name(0)
        info["capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        info["memory_gib"] = round(props.total_memory / 2**30, 1)
        peak = peak_bf16_flops(info["name"])
        info["peak_bf16_tflops"] = peak and peak / 1e12
    return info


def peak_bf16_flops(name: str) -> float | None:
    """The card's peak dense bf16 FLOP/s from its name; None for a card not in `PEAK_BF16`."""
    return next((flops for key, flops in PEAK_BF16 if key in name), None)


def _version(package: str) -> str | None:
    try:
        return __import__(package).__version__
    except ImportError:
        return None


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _peak_gib() -> float | None:
    if not torch.cuda.is_available():
        return None
    return round(torch.cuda.max_memory_allocated() / 2**30, 2)


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


# -- the model and the data --------------------------------------------------------------


def build_model(shape: Shape, folder: Path) -> Path:
    """A checkpoint folder of `shape` with random bf16 weights and a tokenizer trained here."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from agentgym_core import distributed
    from agentgym_core.modeling.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(CORPUS, vocab_size=512, chat_template="chatml")
    config = Qwen2Config(
        vocab_size=shape.vocab or len(tokenizer),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        tie_word_embeddings=shape.tied,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    with distributed.device():  # initialised where it runs: a 7B init on the CPU takes minutes
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    _free()
    return folder


def synthetic_batch(shape: Shape, vocab: int, seed: int, *, varied: bool = False) -> Any:
    """Multi-turn GRPO trajectories: a prompt, then actions (trained) and observations.

    Groups of 4 with rewards 1, 0, 1, 0, so every trajectory has an advantage.
    The sampler's log-probabilities are those of a near-uniform random model.
    `varied`: as GRPO's episodes are, each group's 4 share one prompt (their task's) and
    each plays 1 to `shape.turns` turns (uniformly); else every token is drawn and all
    play every turn.
    """
    from agentgym_core.types import Trajectory, TrajectoryBatch

    rng = random.Random(seed)
    turn = [1] * shape.action + [0] * shape.observation
    sampled = -math.log(vocab)
    trajectories: list[Trajectory] = []
    for index in range(shape.trajectories):
        turns = rng.randint(1, shape.turns) if varied else shape.turns
        mask = [0] * shape.prompt + turn * turns
        tokens = [rng.randrange(3, vocab) for _ in mask]
        if varied and index % 4:
            tokens[: shape.prompt] = trajectories[-1].token_ids[: shape.prompt]
        trajectories.append(
            Trajectory(
                task_id=index // 4,
                group=index // 4,
                token_ids=tokens,
                loss_mask=list(mask),
                logprobs=[sampled * m for m in mask],
                reward=float(index % 2 == 0),
            )
        )
    return TrajectoryBatch(trajectories)


# -- one case: open a learner through the config, update, generate -----------------------


def open_case(
    folder: Path,
    shape: Shape,
    work: Path,
    *,
    lora: str | None,
    attn: str,
    dtype: str,
    packing: str = "auto",
    head_chunk: int | None = None,
) -> Any:
    """`runtime.open_learner` on a config of the model folder (checkpointing, LoRA).

    `lora`: None for full fine-tuning, else the adapter's `adapter_dtype`;
    `packing`: `trainer.packing`; `head_chunk`: `trainer.logprob_chunk_tokens`.
    """
    from agentgym_algo_grpo import GRPO, GRPOConfig

    from agentgym_core.config.schema import AgentGymConfig
    from agentgym_core.run.runtime import open_learner

    model: dict[str, Any] = {
        "path": str(folder),
        "dtype": dtype,
        "gradient_checkpointing": True,
        "attn_implementation": attn,
    }
    if lora:
        model["lora"] = {"r": 16, "alpha": 32, "adapter_dtype": lora}
    root = AgentGymConfig.model_validate(
        {
            "run": {"name": "gpu-check", "output_dir": str(work), "seed": 0},
            "model": model,
            "env": {"name": "synthetic"},
            "algorithm": {"name": "grpo"},
            "trainer": {
                "steps": shape.steps + 1,
                "lr": 1e-5,
                "micro_batch_tokens": shape.micro_batch_tokens,
                "packing": packing,
                "logprob_chunk_tokens": head_chunk,
                "resume": False,
            },
        }
    )
    return open_learner(root, GRPO(GRPOConfig()), folder, work)


class HeadCounter:
    """Counts the tokens the body and the output head run on (forward hooks).

    The head's are the positions the model hands it (a pre-hook, registered
    before the learner's: with `trainer.logprob_chunk_tokens` the learner then
    empties the call and runs the chunks itself, recomputed ones included).
    """

    def __init__(self, model: Any) -> None:
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.body = self.head = 0
        self.handles = [
            inner.get_input_embeddings().register_forward_hook(self._count("body")),
            inner.get_output_embeddings().register_forward_pre_hook(self._count_head),
        ]

    def _count(self, which: str) -> Any:
        def hook(module: Any, args: tuple, output: torch.Tensor) -> None:
            setattr(self, which, getattr(self, which) + output.shape[:-1].numel())

        return hook

    def _count_head(self, module: Any, args: tuple) -> None:
        self.head += args[0].shape[:-1].numel()

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self.handles:
            handle.remove()


def parameter_counts(model: Any) -> dict[str, int]:
    """Total and trainable parameters; those of the body and the output head, for FLOPs."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    embed = inner.get_input_embeddings().weight.numel()
    head = inner.get_output_embeddings().weight.numel()
    unique = {id(p): p for p in model.parameters()}.values()
    total = sum(p.numel() for p in unique)
    lora = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    body = total - lora - embed - (0 if inner.config.tie_word_embeddings else head)
    trainable = sum(p.numel() for p in unique if p.requires_grad)
    return {"total": total, "trainable": trainable, "body": body, "head": head}


def time_updates(
    learner: Any, shape: Shape, vocab: int, peak: float | None, *, varied: bool = False
) -> dict[str, Any]:
    """One warm-up update, then `shape.steps` timed ones: tokens/s, MFU, loss.

    Tokens are the trajectories' own (padding not counted); MFU counts every position
    the model ran on, padding included. `varied`: `synthetic_batch`'s.
    """
    counter = HeadCounter(learner.accelerator.unwrap_model(learner.model))
    params = parameter_counts(learner.unwrapped)
    try:
        metrics = learner.update(_scored(learner, shape, vocab, 0, varied))  # allocator, kernels
        counter.body = counter.head = 0
        seconds, tokens, padding = 0.0, 0, []
        for step in range(1, shape.steps + 1):
            batch = _scored(learner, shape, vocab, step, varied)
            tokens += sum(len(t.token_ids) for t in batch)
            _sync()
            start = time.perf_counter()
            metrics = learner.update(batch)
            _sync()
            seconds += time.perf_counter() - start
            padding.append(metrics.get("padding_fraction", 0.0))
    finally:
        counter.close()
    flops = 6 * (params["body"] * counter.body + params["head"] * counter.head)
    return {
        "update_peak_gib": _peak_gib(),  # before generation: the learner's own peak
        "params": params,
        "train_tokens_per_s": round(tokens / seconds, 1),
        "update_s": round(seconds / shape.steps, 3),
        "mfu": round(flops / seconds / peak, 4) if peak else None,
        "padding_fraction": round(sum(padding) / len(padding), 4),
        "loss": metrics.get("loss"),
        "grad_norm": metrics.get("grad_norm"),
        "finite": all(math.isfinite(metrics.get(k, 0.0)) for k in ("loss", "grad_norm")),
    }


def _scored(learner: Any, shape: Shape, vocab: int, seed: int, varied: bool = False) -> Any:
    batch = synthetic_batch(shape, vocab, seed, varied=varied)
    learner.algorithm.advantages(batch)
    return batch


def time_generation(
    model: Any, tokenizer: Any, shape: Shape, compile_decode: bool = False
) -> dict[str, Any]:
    """One batch of `shape.gen_batch` episodes through the `hf` policy: new tokens per second,
    and the generation thread's seconds by part (`gen_s`: prefill, decode, sampling, kv_cache).

    `compile_decode`: the policy's option; its warm-up decodes as many tokens as the timed
    batch, so the step is compiled (and its CUDA graph recorded) before the clock starts.
    On a CPU the compiled step runs torch.compile's eager backend: plumbing, not speed.
    """
    from agentgym_core.interfaces import SamplingParams
    from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig

    policy = HFPolicy(
        HFPolicyConfig(
            max_batch_size=shape.gen_batch,
            prefix_cache=False,
            gather_ms=50.0,
            compile_decode=compile_decode,
        ),
        model=model,
        tokenizer=tokenizer,
    )
    if next(model.parameters()).device.type != "cuda":
        policy.compile_backend = "eager"
    rng = random.Random(0)
    vocab = len(tokenizer)

    async def play(requests: int, new_tokens: int) -> int:
        params = [SamplingParams(max_new_tokens=new_tokens, seed=i) for i in range(requests)]
        prompts = [[rng.randrange(3, vocab) for _ in range(shape.gen_prompt)] for _ in params]
        done = await asyncio.gather(
            *(policy.generate(p, s) for p, s in zip(prompts, params, strict=True))
        )
        return sum(len(g.token_ids) for g in done)

    try:
        asyncio.run(play(2, shape.gen_tokens if compile_decode else 2))  # warm-up
        _sync()
        policy.seconds.clear()
        start = time.perf_counter()
        tokens = asyncio.run(play(shape.gen_batch, shape.gen_tokens))
        _sync()
        seconds = time.perf_counter() - start
    finally:
        policy.close()
    parts = {part: round(s, 3) for part, s in sorted(policy.seconds.items())}
    return {"gen_tokens_per_s": round(tokens / seconds, 1), "gen_tokens": tokens, "gen_s": parts}


def run_case(
    name: str,
    folder: Path,
    shape: Shape,
    *,
    lora: str | None,
    attn: str,
    peak: float | None,
    dtype: str = "bfloat16",
    packing: str = "auto",
    varied: bool = False,
    generate: bool = True,
    head_chunk: int | None = None,
) -> dict[str, Any]:
    """Open, update, generate (unless not `generate`); the case's row of the summary.

    `packing`: `trainer.packing`; `varied`: `synthetic_batch`'s.
    """
    from agentgym_core import distributed

    _free()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        opened = open_case(
            folder,
            shape,
            Path(work),
            lora=lora,
            attn=attn,
            dtype=dtype,
            packing=packing,
            head_chunk=head_chunk,
        )
        learner = opened.learner
        model = learner.unwrapped
        row: dict[str, Any] = {
            "case": name,
            "device": str(distributed.device()),
            "weights_on": str(next(model.parameters()).device),
            "accelerator_device": str(learner.accelerator.device),
            "distributed_type": str(learner.accelerator.distributed_type).split(".")[-1],
            "sharded": learner.sharded,
            "attention": getattr(model.config, "_attn_implementation", None),
            "rows": "shared" if learner.settings.share_rows else "padded",
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
            "trained_dtype": _trained_dtype(model),
            "mixed_precision": str(learner.accelerator.mixed_precision),
            "logprob_chunk_tokens": head_chunk,
        }
        vocab = model.get_input_embeddings().weight.shape[0]
        row.update(time_updates(learner, shape, vocab, peak, varied=varied))
        if learner.sharded or not generate:
            row["gen_tokens_per_s"] = None  # generation runs on the replica: the 1-GPU case
        else:
            row.update(time_generation(model, opened.tokenizer, shape))
        row["peak_memory_gib"] = _peak_gib()
        masters = getattr(learner, "master_bytes", lambda: 0)()
        row["master_weights_gib"] = round(masters / 2**30, 2)
        del opened, learner, model
    _free()
    row["status"] = "ok" if row["finite"] else "failed: loss or gradient not finite"
    return row


def _trained_dtype(model: Any) -> str:
    """The dtype of the weights the optimizer's gradients come from (an adapter's, with LoRA)."""
    trained = next(p for p in model.parameters() if p.requires_grad)
    return str(trained.dtype).removeprefix("torch.")


# -- the plan: which cases, on which shapes ---------------------------------------------


def full_finetune_fits(shape: Shape, memory_gib: float | None) -> str | None:
    """None when full fine-tuning of `shape` fits the card; else why it is skipped.

    bf16 weights and gradients, float32 master weights, their float32 gradients
    and AdamW's two moments (`learner/precision.py`): 20 bytes a parameter at the
    step, plus 10 GiB for activations and the logits.
    """
    if memory_gib is None:
        return None
    params = _param_estimate(shape)
    need = params * 20 / 2**30 + 10
    if need <= 0.95 * memory_gib:
        return None
    return f"skipped: full fine-tuning needs about {need:.0f} GiB, the card has {memory_gib:.0f}"


def _param_estimate(shape: Shape) -> int:
    attention = shape.hidden * (shape.hidden + 2 * shape.hidden * shape.kv_heads // shape.heads)
    layer = attention + shape.hidden * shape.hidden + 3 * shape.hidden * shape.intermediate
    embed = (shape.vocab or 0) * shape.hidden * (1 if shape.tied else 2)
    return shape.layers * layer + embed


LORA_CASES = {"lora": "float32", "lora, bf16 adapter": "model"}
"""A LoRA case's name (after its size) -> its `model.lora.adapter_dtype`."""


def lora_available() -> str | None:
    """None when `model.lora` exists in the config schema; else why LoRA cases are skipped."""
    from agentgym_core.config.schema import ModelConfig

    if "lora" not in ModelConfig.model_fields:
        return "skipped: agentgym_core.config.schema.ModelConfig has no `lora` field yet"
    if _version("peft") is None:
        return "skipped: peft is not installed"
    return None


CHUNKED = ", chunked head"
"""The suffix of a case whose learner runs the output head in chunks of `Shape.head_chunk`
agent tokens (`trainer.logprob_chunk_tokens`): the same update, for its memory and time."""

CASES = {
    "full": "full",
    "chunked": "full" + CHUNKED,
    "lora": "lora",
    "lora-bf16": "lora, bf16 adapter",
    "fsdp2": "full fsdp2 (1 process)",
    "fsdp2-chunked": "full fsdp2 (1 process)" + CHUNKED,
}
"""`--cases` keys -> each case's name after its size, in the check's default order."""


def plan(
    sizes: list[str], info: dict[str, Any], fsdp: bool, cases: list[str] | None = None
) -> list[tuple[str, str, Any]]:
    """(case name, shape key, what to run or why not) for every case, in order.

    `cases` picks keys of CASES and their order within each size (to alternate the
    order across processes when comparing two cases); by default all of them.
    """
    unknown = sorted(set(cases or ()) - set(CASES))
    if unknown:
        raise ValueError(f"--cases: unknown {unknown}; known: {', '.join(CASES)}")
    planned: list[tuple[str, str, Any]] = []
    for size in sizes:
        for key in cases or list(CASES):
            name = f"{size} {CASES[key]}"
            if key in ("full", "chunked"):
                planned.append((name, size, full_finetune_fits(SHAPES[size], info["memory_gib"])))
            elif key.startswith("fsdp2"):
                if fsdp and size in ("tiny", "0.5b"):
                    planned.append((name, size, "fsdp"))
            else:
                planned.append((name, size, lora_available()))
    return planned


# -- FSDP2: the same update in one process under `accelerate launch --use_fsdp` ----------


def launch_fsdp(
    folder: Path, size: str, attn: str, timeout: float, head_chunk: int | None = None
) -> dict[str, Any]:
    """This script's `--fsdp-worker` in one FSDP2 rank; its row, as it wrote it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="gpu-check-fsdp-") as work:
        out = Path(work) / "row.json"
        command = [
            *(sys.executable, "-m", "accelerate.commands.launch"),
            *("--num_processes", "1", "--num_machines", "1", "--main_process_port", str(port)),
            *("--mixed_precision", "bf16", "--dynamo_backend", "no"),
            *("--use_fsdp", "--fsdp_version", "2"),
            *("--fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP"),
            *(__file__, "--fsdp-worker", str(folder), "--sizes", size, "--attn", attn),
            *("--json", str(out)),
            *(("--head-chunk", str(head_chunk)) if head_chunk else ()),
        ]
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "4"))
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0 or not out.is_file():
            tail = (done.stdout + done.stderr)[-3000:]
            return {"status": f"failed: the FSDP2 process exited {done.returncode}", "log": tail}
        return json.loads(out.read_text())


def fsdp_worker(
    folder: Path, size: str, attn: str, out: Path, head_chunk: int | None = None
) -> None:
    """Inside the launched rank: the full fine-tuning case under FSDP2.

    float32 weights that FSDP computes with in bf16 (accelerate's mixed precision),
    as the learner asks under FSDP.
    """
    if not torch.cuda.is_available():
        _fsdp_on_cpu()
    peak = machine()["peak_bf16_tflops"]
    peak = peak and peak * 1e12
    row = run_case(
        "fsdp", folder, SHAPES[size], lora=None, attn=attn, peak=peak, dtype="float32",
        head_chunk=head_chunk,
    )  # fmt: skip
    out.write_text(json.dumps(row))


def _fsdp_on_cpu() -> None:
    """accelerate turns FSDP on only on GPUs; mark its state FSDP (as tests/fsdp_cpu.py does).

    Only for `--smoke` on a CPU: torch's FSDP2 runs there over gloo, so the
    smoke run takes the GPU path's code.
    """
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    init = AcceleratorState.__init__

    def as_fsdp(self: Any, *args: Any, fsdp_plugin: Any = None, **kwargs: Any) -> None:
        init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin

    AcceleratorState.__init__ = as_fsdp


# -- the whole check -------------------------------------------------------------------


def check(
    sizes: list[str], attn: str, fsdp: bool, work: Path, cases: list[str] | None = None
) -> dict[str, Any]:
    """Every case of `sizes`: a result row each, failures and skips included."""
    info = machine()
    peak = info["peak_bf16_tflops"] and info["peak_bf16_tflops"] * 1e12
    rows, built = [], {}
    for name, size, what in plan(sizes, info, fsdp, cases):
        print(f"[gpu-check] {name} ...", flush=True)
        if isinstance(what, str) and what.startswith("skipped"):
            rows.append({"case": name, "status": what})
            continue
        start = time.perf_counter()
        try:
            if size not in built:
                built[size] = build_model(SHAPES[size], work / size)
            chunk = SHAPES[size].head_chunk if name.endswith(CHUNKED) else None
            if what == "fsdp":
                row = {"case": name, **launch_fsdp(built[size], size, attn, 420, chunk)}
                row["case"] = name
            else:
                lora = LORA_CASES.get(name.removeprefix(f"{size} "))
                row = run_case(
                    name, built[size], SHAPES[size], lora=lora, attn=attn, peak=peak,
                    head_chunk=chunk,
                )  # fmt: skip
        except Exception as error:  # noqa: BLE001 - one case's failure is a row of the table
            row = {"case": name, "status": f"failed: {type(error).__name__}: {error}"[:400]}
        _free()  # after the except block: its traceback no longer holds the case's tensors
        row["seconds"] = round(time.perf_counter() - start, 1)
        print(f"[gpu-check] {name}: {row['status']}", flush=True)
        rows.append(row)
    return {"machine": info, "attention_requested": attn, "cases": rows}


def check_generation(
    sizes: list[str], attn: str, repeats: int, work: Path, compile_decode: bool = False
) -> dict[str, Any]:
    """Generation alone: the `hf` policy's batch `repeats` times per shape, no learner.

    For timing a change to generation before and after, one process each, alternated.
    `compile_decode`: each repeat times the plain decode step, then the compiled one
    (`policy.compile_decode`), so a drift in the machine touches both arms alike.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym_core import distributed

    rows = []
    for size in sizes:
        folder = build_model(SHAPES[size], work / size)
        model = AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.bfloat16, attn_implementation=attn
        ).to(distributed.device())
        tokenizer = AutoTokenizer.from_pretrained(folder)
        arms = [(" plain", False), (" compiled", True)] if compile_decode else [("", False)]
        for repeat in range(repeats):
            for suffix, compiled in arms:
                row = {"case": f"{size} generation {repeat + 1}{suffix}", "status": "ok"}
                row["weights_on"] = str(next(model.parameters()).device)
                row["attention"] = attn
                row["compile_decode"] = compiled
                try:
                    row.update(time_generation(model, tokenizer, SHAPES[size], compiled))
                except Exception as error:  # noqa: BLE001 - one arm's failure is a row
                    row["status"] = f"failed: {type(error).__name__}: {error}"[:400]
                    row["gen_tokens_per_s"] = None
                print(f"[gpu-check] {row['case']}: {row['gen_tokens_per_s']} tok/s", flush=True)
                rows.append(row)
        del model
        _free()
    return {"machine": machine(), "attention_requested": attn, "cases": rows}


PACKINGS = {
    "padded": ("sdpa", "padded"),
    "shared-flex": ("flex_attention", "shared"),
    "shared-sdpa": ("sdpa", "shared"),
}
"""`--packings` keys -> (`model.attn_implementation`, `trainer.packing`) of each arm: one
trajectory per padded row under SDPA's fused causal kernel (`packing: auto` without flash
or flex), several to a row under flex's block mask (`auto` under flex_attention), and
several to a row under SDPA with the dense block-diagonal mask transformers builds."""


def check_packing(
    sizes: list[str], packings: list[str], repeats: int, work: Path
) -> dict[str, Any]:
    """The update alone on varied-length trajectories, each of `packings` in turn, `repeats`
    rounds (arm after arm, so a drift in the machine touches every arm alike)."""
    unknown = sorted(set(packings) - set(PACKINGS))
    if unknown:
        raise ValueError(f"--packings: unknown {unknown}; known: {', '.join(PACKINGS)}")
    info = machine()
    peak = info["peak_bf16_tflops"] and info["peak_bf16_tflops"] * 1e12
    device = "cuda" if torch.cuda.is_available() else "cpu"
    missing = {attn: None for attn, _ in PACKINGS.values()}
    missing["flex_attention"] = flex_backward_missing(device)
    rows = []
    for size in sizes:
        folder = build_model(SHAPES[size], work / size)
        for repeat in range(repeats):
            for key in packings:
                attn, packing = PACKINGS[key]
                name = f"{size} {key} {repeat + 1}"
                print(f"[gpu-check] {name} ...", flush=True)
                start = time.perf_counter()
                try:
                    row = {"case": name, "status": missing[attn]}
                    if not row["status"]:
                        row = run_case(
                            name, folder, SHAPES[size], lora=None, attn=attn, peak=peak,
                            packing=packing, varied=True, generate=False,
                        )  # fmt: skip
                except Exception as error:  # noqa: BLE001 - one arm's failure is a row
                    row = {"case": name, "status": f"failed: {type(error).__name__}: {error}"[:400]}
                _free()
                row["seconds"] = round(time.perf_counter() - start, 1)
                print(f"[gpu-check] {name}: {row['status']}", flush=True)
                rows.append(row)
    return {"machine": info, "attention_requested": "per arm", "packing_only": True, "cases": rows}


def flex_backward_missing(device: str) -> str | None:
    """Why flex_attention cannot train on `device` (torch 2.13: not on a CPU); None if it can."""
    from torch.nn.attention.flex_attention import flex_attention

    query = torch.zeros(1, 1, 16, 16, device=device, requires_grad=True)
    try:
        flex_attention(query, query, query)
    except NotImplementedError as error:
        return f"skipped: flex_attention has no backward pass on {device}: {error}"[:200]
    return None


COLUMNS = [
    ("case", "case"),
    ("status", "status"),
    ("train_tokens_per_s", "train tok/s"),
    ("mfu", "MFU"),
    ("gen_tokens_per_s", "gen tok/s"),
    ("update_peak_gib", "update GiB"),
    ("peak_memory_gib", "peak GiB"),
    ("weights_on", "device"),
    ("attention", "attention"),
]
PACKING_COLUMNS = [("rows", "rows"), ("padding_fraction", "padding")]
"""How the learner laid trajectories out: shared or padded rows, and the share of padding."""


def table(result: dict[str, Any]) -> str:
    """The summary: the machine, then one line per case."""
    info = result["machine"]
    peak = info["peak_bf16_tflops"]
    memory = f"{info['memory_gib']} GiB" if info["memory_gib"] else "no CUDA device"
    head = (
        f"GPU check on {info['name']} ({memory}, peak bf16 "
        f"{f'{peak:.0f} TFLOP/s' if peak else 'unknown: MFU unknown'}), torch {info['torch']}, "
        f"transformers {info['transformers']}, accelerate {info['accelerate']}, "
        f"peft {info['peft']}, flash-attn {info['flash_attn']}"
    )
    columns = COLUMNS + PACKING_COLUMNS
    if result.get("packing_only"):
        columns = [c for c in columns if c[0] != "gen_tokens_per_s"]
    lines = [[title for _, title in columns]]
    for row in result["cases"]:
        lines.append([_cell(key, row.get(key)) for key, _ in columns])
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns))]
    rendered = ["  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) for line in lines]
    return "\n".join([head, *rendered])


def _cell(key: str, value: Any) -> str:
    if value is None:
        return "-" if key != "mfu" else "unknown"
    if key in ("mfu", "padding_fraction"):
        return f"{100 * value:.1f}%"
    if key == "status" and len(str(value)) > 60:
        return str(value)[:57] + "..."
    return f"{value:,.0f}" if isinstance(value, float) and key.endswith("per_s") else str(value)


def json_path(given: str | None) -> Path:
    """Where the JSON goes: `--json`, $AGENTGYM_GPU_CHECK_JSON, $OUT/gpu_check.json, runs/."""
    if given:
        return Path(given)
    if os.environ.get("AGENTGYM_GPU_CHECK_JSON"):
        return Path(os.environ["AGENTGYM_GPU_CHECK_JSON"])
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "gpu_check.json"
    return Path("runs") / "gpu_check.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="a tiny model: checks the plumbing")
    parser.add_argument("--sizes", default=None, help="comma-separated of tiny, 0.5b, 7b")
    parser.add_argument(
        "--attn", default="auto", help="auto (flash_attention_2 if installed, else sdpa), "
        "sdpa, flash_attention_2 or eager",
    )  # fmt: skip
    parser.add_argument("--no-fsdp", action="store_true", help="skip the FSDP2 process")
    parser.add_argument(
        "--cases", default=None, help=f"comma-separated of {', '.join(CASES)}, run in that order"
    )
    parser.add_argument("--json", default=None, help="where to write the JSON summary")
    parser.add_argument(
        "--generation-only", action="store_true", help="time the hf policy's batch alone"
    )
    parser.add_argument(
        "--compile-decode",
        action="store_true",
        help="with --generation-only: each repeat times the plain and the compiled decode step",
    )
    parser.add_argument(
        "--packing-only", action="store_true", help="time the update alone per packing arm"
    )
    parser.add_argument(
        "--packings",
        default=",".join(PACKINGS),
        help=f"with --packing-only: comma-separated of {', '.join(PACKINGS)}, in round order",
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="with --generation-only or --packing-only"
    )
    parser.add_argument("--fsdp-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--head-chunk", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    attn = args.attn
    if attn == "auto":
        attn = "flash_attention_2" if _version("flash_attn") else "sdpa"
    every = "0.5b" if args.packing_only else "0.5b,7b"  # 7B full fine-tuning fits no card
    sizes = (args.sizes or ("tiny" if args.smoke else every)).split(",")
    if args.fsdp_worker:
        fsdp_worker(Path(args.fsdp_worker), sizes[0], attn, Path(args.json), args.head_chunk)
        return 0
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-models-") as work:
        if args.generation_only:
            result = check_generation(sizes, attn, args.repeats, Path(work), args.compile_decode)
        elif args.packing_only:
            result = check_packing(sizes, args.packings.split(","), args.repeats, Path(work))
        else:
            cases = args.cases.split(",") if args.cases else None
            result = check(sizes, attn, not args.no_fsdp, Path(work), cases)
    result["smoke"] = args.smoke
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["mlflow_imported"] = "mlflow" in sys.modules
    out = json_path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    print("\n" + table(result) + f"\n\nJSON: {out}")
    return 1 if any(r["status"].startswith("failed") for r in result["cases"]) else 0


if __name__ == "__main__":
    sys.exit(main())
