"""LoRA against full fine-tuning: training memory and seconds per update, then learning.

Memory and speed (`--memory`): a model large enough to matter on a CPU (hidden
512, 8 layers by default, built like `agentgym model init` does), one learner
update after another on the same batch of synthetic trajectories, each arm in a
fresh process, arms interleaved per repeat. Prints, per arm: the bytes of what
training keeps (weights, gradients, optimizer state: the tensors themselves,
summed), the peak resident memory of the process over its baseline before the
model was loaded (activations included), and the median seconds per update.

    .venv/bin/python benchmarks/lora.py --memory --repeats 3

Learning (`--learn`): the demo's config (`configs/babyai-demo.yaml`) and model,
each arm trained per seed (interleaved) and evaluated on the demo's 200
held-out tasks before and after.

    .venv/bin/python benchmarks/lora.py --learn --seeds 0 1 2 3 4 --arms full lora

An arm is `full` or `lora` (rank 16, alpha 32, every linear layer), with
`:bf16` for bfloat16 weights (float32 master copies of trained weights).
The LoRA arm of `--learn` uses 10x the demo's learning rate, the usual
LoRA-to-full ratio, chosen before any run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.memory import peak_rss_mib, rss_mib  # noqa: E402

CONFIG = ROOT / "configs" / "babyai-demo.yaml"
LORA = {"r": 16, "alpha": 32}
LORA_LR_FACTOR = 10.0


def build(out: Path, hidden: int, layers: int) -> Path:
    """A BabyAI model of the given size, tokenizer trained on BabyAI's text."""
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model

    env = BabyAIEnv(BabyAIConfig(levels=["GoToObj", "GoToLocal"], list_actions=False))
    texts = env_corpus(env, list(env.tasks("train"))[:100], max_turns=6)
    heads = max(4, hidden // 64)
    config = TinyModelConfig(
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=max(1, heads // 4),
        intermediate_size=4 * hidden,
        vocab_size=512,
    )
    return init_model(texts, out, config)


def _batch(vocab: int, count: int, length: int, seed: int):
    from agentgym_core.types import Trajectory, TrajectoryBatch

    rng = random.Random(seed)
    trajectories = []
    for index in range(count):
        ids = [rng.randrange(3, vocab) for _ in range(length)]
        mask = [0] * (length // 3) + [
            1 if rng.random() < 0.4 else 0 for _ in range(length - length // 3)
        ]
        traj = Trajectory(task_id=index, group=index // 8, token_ids=ids, loss_mask=mask)
        traj.logprobs = [0.0] * length
        traj.advantages = [(1.0 if index % 2 else -1.0) * m for m in mask]
        trajectories.append(traj)
    return TrajectoryBatch(trajectories)


def saved_by_autograd(model, batch) -> float:
    """MiB of the tensors autograd keeps for the backward pass of one micro-batch's forward."""
    import torch

    from agentgym_core.learner.forward import policy_forward
    from agentgym_core.learner.packing import pack

    first = pack(batch.trajectories, row_tokens=None, micro_batch_tokens=4096, share_rows=False)[0]
    seen: dict[tuple, int] = {}

    def keep(tensor):
        if not isinstance(tensor, torch.nn.Parameter):
            seen[(tensor.data_ptr(), tensor.dtype)] = tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        policy_forward(model.train(), first, 1.0)
    return sum(seen.values()) / 2**20


def _lora_block(kind: str) -> dict | None:
    """The arm's `model.lora`: `lora` (every layer), `lora-topN` (the last N layers), else none."""
    if kind == "lora":
        return LORA
    if kind.startswith("lora-top"):
        return {**LORA, "top_layers": int(kind.removeprefix("lora-top"))}
    return None


def one_memory_run(model: Path, arm: str, updates: int) -> dict:
    """In this (fresh) process: the arm's learner, `updates` updates; its measurements."""
    import torch
    from agentgym_algo_grpo import GRPO, GRPOConfig

    from agentgym_core.config.schema import ModelConfig
    from agentgym_core.learner.learner import Learner
    from agentgym_core.learner.settings import LearnerSettings
    from agentgym_core.run.runtime import load_training_model

    kind, _, dtype = arm.partition(":")
    torch.manual_seed(0)
    baseline = rss_mib()
    block = ModelConfig(
        path=str(model),
        dtype="bfloat16" if dtype == "bf16" else "float32",
        lora=_lora_block(kind),
    )
    net, _ = load_training_model(block, model, None)
    learner = Learner(net, GRPO(GRPOConfig()), LearnerSettings(lr=1e-4, micro_batch_tokens=4096))
    batch = _batch(net.config.vocab_size, count=16, length=384, seed=1)
    seconds = []
    for _ in range(updates + 1):
        start = time.perf_counter()
        learner.update(batch)
        seconds.append(time.perf_counter() - start)
    params = list(learner.unwrapped.parameters())
    trainable = [p for p in params if p.requires_grad]
    state_bytes = sum(
        t.numel() * t.element_size()
        for s in learner.optimizer.state.values()
        for t in s.values()
        if torch.is_tensor(t)
    )
    kept = {
        "weights": sum(p.numel() * p.element_size() for p in params),
        # a gradient has its weight's dtype; set_to_none frees them between steps, so count them
        "gradients": sum(p.numel() * p.element_size() for p in trainable),
        "optimizer": state_bytes + learner.master_bytes(),
    }
    return {
        "arm": arm,
        "params": sum(p.numel() for p in params),
        "trainable": sum(p.numel() for p in trainable),
        "kept_mib": sum(kept.values()) / 2**20,
        "kept": {k: v / 2**20 for k, v in kept.items()},
        "peak_mib": peak_rss_mib() - baseline,
        "saved_mib": saved_by_autograd(learner.unwrapped, batch),
        "seconds": statistics.median(seconds[1:]),
    }


def memory(args: argparse.Namespace) -> None:
    """Every arm in its own process, interleaved per repeat; a markdown table."""
    work = Path(tempfile.mkdtemp(prefix="agentgym-lora-"))
    model = build(work / "model", args.hidden, args.layers)
    runs: dict[str, list[dict]] = {arm: [] for arm in args.arms}
    for _ in range(args.repeats):
        for arm in args.arms:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one-memory",
                    arm,
                    "--model",
                    str(model),
                    "--updates",
                    str(args.updates),
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            runs[arm].append(json.loads(out.stdout.strip().splitlines()[-1]))
    first = args.arms[0]
    base_kept = statistics.median(r["kept_mib"] for r in runs[first])
    print(f"\nhidden {args.hidden}, {args.layers} layers; median of {args.repeats} processes\n")
    print(
        "| arm | params | trainable | weights + grads + optimizer MiB | vs first | "
        "peak RSS over baseline MiB | autograd keeps, one micro-batch MiB | s / update |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for arm, results in runs.items():
        kept = statistics.median(r["kept_mib"] for r in results)
        peak = statistics.median(r["peak_mib"] for r in results)
        seconds = statistics.median(r["seconds"] for r in results)
        saved = statistics.median(r["saved_mib"] for r in results)
        print(
            f"| {arm} | {results[0]['params']:,} | {results[0]['trainable']:,} | {kept:.1f} | "
            f"{base_kept / kept:.2f}x less | {peak:.0f} | {saved:.0f} | {seconds:.2f} |"
        )


def learn(args: argparse.Namespace) -> None:
    """Train every arm per seed (interleaved), evaluate before and after on held-out tasks."""
    from agentgym_core.config.load import load_config
    from agentgym_core.plugins import PluginHost
    from agentgym_core.run.eval_stage import run_eval_stage
    from agentgym_core.run.kinds import run_stage
    from examples.babyai_demo import build_model

    host = PluginHost()
    work = Path(tempfile.mkdtemp(prefix="agentgym-lora-learn-"))
    rows = []
    for seed in args.seeds:
        model = work / f"model-{seed}"
        resolved = load_config(CONFIG, [f"model.path={model}", f"run.seed={seed}"], host.registry)
        build_model(host, resolved, model, {})
        before, _ = run_eval_stage(resolved, host, model)
        for arm in args.arms:
            kind, _, dtype = arm.partition(":")
            lr = resolved.root.trainer.lr * (LORA_LR_FACTOR if kind == "lora" else 1.0)
            overrides = [
                f"model.path={model}",
                f"run.output_dir={work / f'{arm}-{seed}'}",
                f"run.seed={seed}",
                f"trainer.steps={args.steps}",
                f"trainer.lr={lr}",
                "trainer.checkpoint_every=0",
                "tracking.log_trajectories=0",
                "stages=null",
            ]
            if kind == "lora":
                overrides.append(f"model.lora={{r: {LORA['r']}, alpha: {LORA['alpha']}}}")
            if dtype == "bf16":
                overrides.append("model.dtype=bfloat16")
            resolved = load_config(CONFIG, overrides, host.registry)
            start = time.perf_counter()
            result = run_stage(resolved, host, show_progress=False, quiet=True)
            seconds = time.perf_counter() - start
            after, _ = run_eval_stage(resolved, host, result.checkpoint)
            row = {
                "seed": seed,
                "arm": arm,
                "before": before["success_rate"],
                "after": after["success_rate"],
                "train_s": seconds,
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    print("\n| arm | held-out before | held-out after (min-max) | seeds | train s |")
    print("| --- | --- | --- | --- | --- |")
    for arm in args.arms:
        mine = [r for r in rows if r["arm"] == arm]
        afters = [r["after"] for r in mine]
        print(
            f"| {arm} | {statistics.mean(r['before'] for r in mine):.3f} | "
            f"{statistics.mean(afters):.3f} ({min(afters):.3f}-{max(afters):.3f}) | "
            f"{len(mine)} | {statistics.mean(r['train_s'] for r in mine):.0f} |"
        )


def main() -> None:
    """Parse the mode and run it."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--learn", action="store_true")
    parser.add_argument("--arms", nargs="+", default=["full", "lora"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--one-memory", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_memory:
        print(json.dumps(one_memory_run(Path(args.model), args.one_memory, args.updates)))
    elif args.memory:
        memory(args)
    elif args.learn:
        learn(args)
    else:
        parser.error("say --memory or --learn")


if __name__ == "__main__":
    main()
