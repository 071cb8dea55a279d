"""SmolLM2-135M in bfloat16 on the CPU: PyTorch's bfloat16 products against float32 kernels.

On a CPU without bfloat16 instructions (no avx512_bf16 or AMX: see the `flags`
line printed first), PyTorch emulates bfloat16 matrix products.
`agentgym_core/modeling/cpu_bf16.py` then runs bfloat16 linear layers through
float32 kernels. The arms, interleaved within each repeat in one process:

- `bf16`: bfloat16 weights, PyTorch's bfloat16 products;
- `float32`: the model in float32;
- `bf16:f32-kernels`: bfloat16 weights, linear layers through float32 kernels.

`--arms` takes a subset, in the order the table shows them (speeds are against
the first). The work: a decode step (32 rows of one new token, no cache), a prefill (4 rows
of 512 tokens) and a LoRA training step (rank 16 on every linear layer, forward
and backward over 2 rows of 512 tokens). Seconds are the best of `--repeats`.

    .venv/bin/python benchmarks/cpu_bf16.py --repeats 3
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


ARMS = {
    "bf16": ("bfloat16", False),
    "float32": ("float32", False),
    "bf16:f32-kernels": ("bfloat16", True),
}
"""Each arm's weights dtype and whether it runs bfloat16 through float32 kernels (its linear
layers, and its training attention: `sdpa_gqa` asks `bf16_is_emulated`, which each arm's
work is given its own answer to, so `bf16` stays PyTorch's bfloat16 throughout)."""


def main(argv: list[str] | None = None) -> None:
    """Build the arms and time each piece of work, arms interleaved."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    args = parser.parse_args(argv)

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    import agentgym_core.modeling.attention as attention
    from agentgym_core.modeling.attention import prefer_sdpa_gqa
    from agentgym_core.modeling.cpu_bf16 import compute_bf16_linears_in_float32, has_native_bf16
    from agentgym_core.modeling.fetch import fetch

    folder = fetch("smollm2-135m-instruct", log=None)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"native bfloat16: {has_native_bf16()}"
    )

    def load(dtype: str, swap: bool):
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype))
        prefer_sdpa_gqa(model)
        compute_bf16_linears_in_float32(model, emulated=swap)
        return model

    models = {name: load(*ARMS[name]) for name in args.arms}
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")
    trained = {name: get_peft_model(copy.deepcopy(m), lora) for name, m in models.items()}
    draw = torch.Generator().manual_seed(0)
    decode = torch.randint(100, 40_000, (32, 1), generator=draw)
    prefill = torch.randint(100, 40_000, (4, 512), generator=draw)
    train = torch.randint(100, 40_000, (2, 512), generator=draw)

    def forward(model, ids) -> None:
        with torch.no_grad():
            model(input_ids=ids, logits_to_keep=1)

    def update(model) -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=train, labels=train).loss.backward()

    work = {
        "decode step, 32 rows": lambda name: forward(models[name], decode),
        "prefill, 4 x 512 tokens": lambda name: forward(models[name], prefill),
        "LoRA forward+backward, 2 x 512": lambda name: update(trained[name]),
    }
    best = {(w, n): float("inf") for w in work for n in models}

    def timed(label: str, name: str) -> float:
        swap = ARMS[name][1]
        attention.bf16_is_emulated = lambda: swap  # the arm's kernels, not the machine's
        start = time.perf_counter()
        work[label](name)
        return time.perf_counter() - start

    for name in models:  # one untimed round: first-call allocations
        for label in work:
            timed(label, name)
    for _ in range(args.repeats):
        for label in work:
            for name in models:
                best[label, name] = min(best[label, name], timed(label, name))
    first = args.arms[0]
    print(f"\nbest of {args.repeats}, seconds (speed vs {first})\n")
    print("| work | " + " | ".join(models) + " |")
    print("| --- | " + " | ".join("---" for _ in models) + " |")
    for label in work:
        cells = [
            f"{best[label, n]:.3f} ({best[label, first] / best[label, n]:.2f}x)" for n in models
        ]
        print(f"| {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
