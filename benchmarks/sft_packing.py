"""SFT updates with shared rows vs padded rows, on the same batches, interleaved.

An offline stage (SFT, DPO) packs each micro-batch's sequences several to a row
by default (`trainer.packing: auto`), which needs a block-diagonal attention mask:
SDPA then takes its dense path, quadratic in the row's width. `padded` gives each
sequence its own right-padded row under plain causal attention (SDPA's fused
kernels), at the price of the padding. Online stages already pick `padded` without
flash attention (`benchmarks/learner_overhead.py`). This measures the offline case
where it costs most, long multi-turn episodes: the BabyAI moonshot's SFT (its model
shape, 20-turn expert episodes of AgentGym's 40 levels, 16 per step, 16,384 tokens
per forward pass). Each variant has its own copy of the same start model and gets
the same batches; their order alternates from batch to batch. The first update's
loss is printed for each: the same math, so they agree to rounding.

    .venv/bin/python benchmarks/sft_packing.py --model M --expert E   # a run's own
    .venv/bin/python benchmarks/sft_packing.py                        # builds both
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from agentgym_algo_sft import SFT, SFTConfig
from agentgym_env_babyai import BabyAIConfig, BabyAIEnv
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentgym_core.data.agenttraj import parse_items, read_items, tokenize
from agentgym_core.data.expert import expert_items
from agentgym_core.learner.learner import Learner
from agentgym_core.learner.sequence import sequence_update
from agentgym_core.learner.settings import LearnerSettings
from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.types import Trajectory

MOONSHOT_SHAPE = TinyModelConfig(
    hidden_size=128, num_layers=4, num_heads=4, intermediate_size=256, vocab_size=768
)
ENV = BabyAIConfig(
    levels="agentgym",
    list_actions=False,
    instruction="Reach the goal with one action per turn.",
)


def build(folder: Path, episodes: int) -> tuple[Path, list]:
    """A moonshot-shaped model and the expert's successful episodes of the first train tasks."""
    env = BabyAIEnv(ENV)
    tasks = env.tasks("train")
    init_model(env_corpus(env, tasks[:400], max_turns=8), folder, MOONSHOT_SHAPE)
    run = expert_items(env, "babyai", tasks[:episodes], max_turns=20, timeout_s=60.0)
    env.close()
    return folder, parse_items(run.items, "<expert babyai>")


def sequences(model_dir: Path, items: list) -> tuple[torch.nn.Module, list[Trajectory]]:
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    chat = ChatFormat(AutoTokenizer.from_pretrained(model_dir), model.generation_config)
    out = []
    for item in items:
        ids, mask = tokenize(chat, item.conversations)
        if len(ids) <= 4096:  # the moonshot's rollout.max_context_tokens
            out.append(
                Trajectory(
                    task_id=0, group=0, token_ids=ids, loss_mask=mask, logprobs=[0.0] * len(ids)
                )
            )
    return model, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, help="a model folder (default: build one)")
    parser.add_argument("--expert", type=Path, help="AgentTraj JSON (default: play the expert)")
    parser.add_argument("--episodes", type=int, default=200, help="expert tasks, when built")
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--micro-batch-tokens", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=2, help="passes over the batches")
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        if args.model is None or args.expert is None:
            model_dir, items = build(Path(tmp) / "model", args.episodes)
        model_dir = args.model or model_dir
        items = read_items(args.expert) if args.expert else items
        model, data = sequences(model_dir, items)
    rng = random.Random(0)
    batches = [rng.sample(data, args.batch_size) for _ in range(args.batches)]
    settings = LearnerSettings(lr=3e-3, micro_batch_tokens=args.micro_batch_tokens, seed=0)
    sft = SFT(SFTConfig(files=["(given here)"]))  # its data: the batches below
    variants = {"shared rows": True, "padded rows": False}
    learners = {
        name: Learner(copy.deepcopy(model), sft, dataclasses.replace(settings, share_rows=shared))
        for name, shared in variants.items()
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    first_loss: dict[str, float] = {}
    for step, batch in enumerate(batches * args.repeats):
        order = list(variants) if step % 2 == 0 else list(reversed(variants))
        for name in order:
            start, start_cpu = time.perf_counter(), time.process_time()
            metrics = sequence_update(
                learners[name],
                sft,
                [(t,) for t in batch],
                micro_batch_tokens=args.micro_batch_tokens,
                share_rows=variants[name],
            )
            if step > 0:  # the first is a warm-up (allocator, first-call costs)
                times[name].append(time.perf_counter() - start)
                cpu[name].append(time.process_time() - start_cpu)
            first_loss.setdefault(name, metrics["loss"])
    lengths = [len(t.token_ids) for t in data]
    print(
        f"{len(data)} expert episodes, tokens per episode: median {statistics.median(lengths):.0f},"
        f" max {max(lengths)}; {args.batches} batches of {args.batch_size} x {args.repeats}"
        f" passes, the first update a warm-up; torch threads {torch.get_num_threads()}"
    )
    base = statistics.median(times["shared rows"])
    base_cpu = statistics.median(cpu["shared rows"])
    print("| variant | wall s / update (median) | vs shared | CPU s / update | first loss |")
    print("|---|---|---|---|---|")
    for name in variants:
        wall, used = statistics.median(times[name]), statistics.median(cpu[name])
        print(
            f"| {name} | {wall:.3f} | {wall / base:.2f}x | {used:.3f} ({used / base_cpu:.2f}x) |"
            f" {first_loss[name]:.6f} |"
        )


if __name__ == "__main__":
    main()
