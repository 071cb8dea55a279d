"""Rollouts ahead of the learner (`trainer.max_staleness`) against the synchronous loop.

The demo's config (`configs/babyai-demo.yaml`) and the demo's fresh model;
each seed trains every `--staleness` value in turn (interleaved, so load on the
machine hits all alike), then evaluates on the demo's held-out tasks when
`--eval`. Prints training wall time, its split into rollout and learner time,
the ratio to staleness 0, and held-out success.

    .venv/bin/python benchmarks/staleness.py --steps 30                      # a quick look
    .venv/bin/python benchmarks/staleness.py --steps 150 --seeds 0 1 2 --eval # the issue's figure

An arm is `max_staleness` or `max_staleness:worker` (`1:process` plays the rollouts in
a child process, `trainer.rollout_worker: process`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentgym_core.config.load import load_config  # noqa: E402
from agentgym_core.plugins import PluginHost  # noqa: E402
from agentgym_core.run.eval_stage import run_eval_stage  # noqa: E402
from agentgym_core.run.kinds import run_stage  # noqa: E402
from examples.babyai_demo import build_model  # noqa: E402

CONFIG = ROOT / "configs" / "babyai-demo.yaml"


def train(model: Path, out: Path, seed: int, steps: int, arm: str, host: PluginHost):
    """One training run; (resolved config, result, wall seconds)."""
    overrides = [
        f"model.path={model}",
        f"run.output_dir={out}",
        f"run.seed={seed}",
        f"trainer.steps={steps}",
        f"trainer.max_staleness={arm.split(':')[0]}",
        f"trainer.rollout_worker={arm.split(':')[1] if ':' in arm else 'thread'}",
        "trainer.checkpoint_every=0",
        "tracking.log_trajectories=0",
        "stages=null",
    ]
    resolved = load_config(CONFIG, overrides, host.registry)
    start = time.perf_counter()
    result = run_stage(resolved, host, show_progress=False, quiet=True)
    return resolved, result, time.perf_counter() - start


def main() -> None:
    """Run the arms seed by seed and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--arms", nargs="+", default=["0", "1", "1:process"])
    parser.add_argument("--eval", action="store_true", help="held-out success after training")
    args = parser.parse_args()
    host = PluginHost()
    rows: dict[str, list[dict[str, float]]] = {arm: [] for arm in args.arms}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            base = load_config(CONFIG, [f"run.seed={seed}"], host.registry)
            model = build_model(host, base, Path(tmp) / f"model-{seed}", {})
            for arm in args.arms:
                out = Path(tmp) / f"s{seed}-{arm.replace(':', '-')}"
                resolved, result, wall = train(model, out, seed, args.steps, arm, host)
                row = {
                    "wall": wall,
                    "rollout": sum(h["rollout/seconds"] for h in result.history),
                    "learner": sum(h.get("train/update_seconds", 0.0) for h in result.history),
                    "train_success": statistics.mean(
                        h["rollout/success_rate"] for h in result.history[-10:]
                    ),
                }
                if args.eval:
                    metrics, _ = run_eval_stage(resolved, host, result.checkpoint)
                    row["heldout"] = metrics["success_rate"]
                rows[arm].append(row)
                print(f"seed {seed} arm {arm}: {row}", flush=True)
    sync = statistics.mean(r["wall"] for r in rows[args.arms[0]])
    print(
        "\n| max_staleness[:worker] | train wall s (mean) | vs first | rollout s | learner s "
        "| train success, last 10 | held-out success |"
    )
    print("|---|---|---|---|---|---|---|")
    for arm, runs in rows.items():
        wall = statistics.mean(r["wall"] for r in runs)
        held = [r["heldout"] for r in runs if "heldout" in r]
        cells = [
            arm,
            f"{wall:.0f}",
            f"{sync / wall:.2f}x",
            f"{statistics.mean(r['rollout'] for r in runs):.0f}",
            f"{statistics.mean(r['learner'] for r in runs):.0f}",
            f"{statistics.mean(r['train_success'] for r in runs):.3f}",
            f"{statistics.mean(held):.3f} ({min(held):.3f}-{max(held):.3f})" if held else "-",
        ]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
