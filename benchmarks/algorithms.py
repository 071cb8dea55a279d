"""Every online algorithm at the same budget on BabyAI, from the same starting model.

One fresh tiny model (the `agentgym model init` recipe, fixed seed) is the
start of every run. Each algorithm takes its `algorithm` block from its shipped
config (GRPO: the demo's); everything else is shared: levels, horizon, steps,
tasks x samples per step, learning rate, and the run seeds, so every algorithm
sees the same tasks at every step. After training, each checkpoint is evaluated
on the same held-out tasks. Reports, per algorithm, the median over seeds of:
held-out success, wall time of the training stage, sampled tokens per second
of training wall time, and the learner's share of that time; wall and CPU time
also as ratios to GRPO's.

    .venv/bin/python benchmarks/algorithms.py --steps 30 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

from agentgym_core.config.load import load_config
from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model
from agentgym_core.plugins import PluginHost
from agentgym_core.run.eval_stage import run_eval_stage
from agentgym_core.run.kinds import run_stage

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ALGORITHMS = {
    "grpo": "babyai-demo.yaml",
    "ppo": "babyai-ppo.yaml",
    "reinforce_pp": "babyai-reinforce_pp.yaml",
    "reinforce_pp-baseline": "babyai-reinforce_pp-baseline.yaml",
    "rloo": "babyai-rloo.yaml",
}
INSTRUCTION = "Reach the goal with one action per turn."


def shipped_algorithm(name: str) -> dict[str, Any]:
    """The `algorithm` block of the algorithm's shipped config."""
    return yaml.safe_load((CONFIGS / ALGORITHMS[name]).read_text())["algorithm"]


def build_model(folder: Path, levels: list[str]) -> Path:
    """A fresh tiny model with a tokenizer trained on the levels' text (fixed seeds)."""
    env = BabyAIEnv(BabyAIConfig(levels=levels, list_actions=False, instruction=INSTRUCTION))
    texts = env_corpus(env, env.tasks("train")[:200], max_turns=4)
    return init_model(texts, folder, TinyModelConfig(vocab_size=512))


def run_config(args: argparse.Namespace, model: Path, out: Path, seed: int, algorithm: dict):
    """The shared config of one run, written to `out`/config.yaml."""
    raw = {
        "run": {"name": out.name, "output_dir": str(out), "seed": seed},
        "model": {"path": str(model)},
        "env": {
            "name": "babyai",
            "levels": args.levels,
            "list_actions": False,
            "instruction": INSTRUCTION,
        },
        "algorithm": algorithm,
        "scheduler": {"name": "fixed", "max_turns": args.max_turns},
        "rollout": {"max_context_tokens": 1024, "max_new_tokens": 12, "concurrency": 128},
        "trainer": {
            "steps": args.steps,
            "tasks_per_step": args.tasks_per_step,
            "group_size": args.group_size,
            "lr": args.lr,
            "checkpoint_every": 0,
            "micro_batch_tokens": 16384,
        },
        "eval": {"split": "test", "num_tasks": args.eval_tasks, "max_turns": args.max_turns},
        "tracking": {"log_trajectories": 0},
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def cpu_seconds() -> float:
    """CPU time of this process, all threads: less sensitive than wall time to other load."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def train_and_eval(path: Path, host: PluginHost) -> dict[str, float]:
    """Train one config, evaluate its checkpoint; wall time and throughput of the training."""
    resolved = load_config(path, [], host.registry)
    start, cpu = time.perf_counter(), cpu_seconds()
    trained = run_stage(resolved, host, show_progress=False)
    wall, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    metrics, _ = run_eval_stage(resolved, host, trained.checkpoint)
    history = trained.history
    return {
        "success": metrics["success_rate"],
        "wall_s": wall,
        "cpu_s": cpu,
        "tokens_per_s": sum(h["rollout/generated_tokens"] for h in history) / wall,
        "learner_share": sum(h.get("train/update_seconds", 0.0) for h in history) / wall,
    }


def table(runs: dict[str, list[dict[str, float]]], before: list[float]) -> str:
    """Markdown table of medians over seeds; wall time also as a ratio to GRPO's."""
    med = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()
    }
    base = med.get("grpo", next(iter(med.values())))
    lines = [
        "| algorithm | eval success | wall time (s) | wall / GRPO | CPU time (s) | CPU / GRPO "
        "| sampled tokens/s | learner share |",
        "|---|---|---|---|---|---|---|---|",
        f"| (starting model) | {statistics.median(before):.3f} | | | | | | |",
    ]
    for name, m in med.items():
        successes = ", ".join(f"{r['success']:.3f}" for r in runs[name])
        lines.append(
            f"| {name} | {m['success']:.3f} ({successes}) | {m['wall_s']:.1f} | "
            f"{m['wall_s'] / base['wall_s']:.2f}x | {m['cpu_s']:.1f} | "
            f"{m['cpu_s'] / base['cpu_s']:.2f}x | {m['tokens_per_s']:.0f} | "
            f"{m['learner_share']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), choices=ALGORITHMS)
    parser.add_argument("--levels", nargs="+", default=["GoToObj", "GoToLocal", "PickupDist"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--tasks-per-step", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--eval-tasks", type=int, default=150)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--json", type=Path, help="also write every run's numbers here")
    args = parser.parse_args()

    host = PluginHost()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in args.algorithms}
    before: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        model = build_model(Path(tmp) / "model", args.levels)
        for seed in args.seeds:
            first = run_config(args, model, Path(tmp) / f"before-{seed}", seed, {"name": "grpo"})
            metrics, _ = run_eval_stage(load_config(first, [], host.registry), host, model)
            before.append(metrics["success_rate"])
            for name in args.algorithms:
                out = Path(tmp) / f"{name}-{seed}"
                result = train_and_eval(
                    run_config(args, model, out, seed, shipped_algorithm(name)), host
                )
                runs[name].append(result)
                print(
                    name, seed, json.dumps({k: round(v, 4) for k, v in result.items()}), flush=True
                )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": None}, "before": before, "runs": runs}, indent=1
            )
        )
    print(table(runs, before))


if __name__ == "__main__":
    main()
