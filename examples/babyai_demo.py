"""`make demo`: a from-scratch agent learns BabyAI with GRPO and ScalingInter-RL on the CPU.

Steps, all timed: build a tiny Qwen2-architecture model whose tokenizer is
trained on BabyAI's own text; evaluate it untrained on held-out test tasks;
train it (configs/babyai-demo.yaml); evaluate it again; print both per level,
and the command that opens the viewer on every evaluation episode.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import torch

from agentgym_core.config.load import load_config
from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model
from agentgym_core.numerics import flush_subnormals
from agentgym_core.plugins import PluginHost
from agentgym_core.run.pipeline import run_pipeline
from agentgym_core.tracking.console import format_table

ROOT = Path(__file__).resolve().parent.parent


def build_model(host: PluginHost, resolved, out: Path, size: dict) -> Path:
    """A fresh tiny model with a tokenizer trained on the configured BabyAI levels."""
    registration, env_config = resolved.components["env"]
    env = registration.factory(env_config)
    try:
        texts = env_corpus(env, list(env.tasks("train"))[:300], max_turns=6, seed=0)
    finally:
        env.close()
    options = {"vocab_size": 512, "seed": resolved.root.run.seed, **size}
    return init_model(texts, out, TinyModelConfig(**options))


def per_level(before: dict[str, float], after: dict[str, float]) -> str:
    """Before/after success per level as a table."""
    levels = sorted({k.split("/")[1] for k in after if k.startswith("group/")})
    rows = [
        {
            "level": level,
            "untrained": before.get(f"group/{level}/success_rate", 0.0),
            "trained": after.get(f"group/{level}/success_rate", 0.0),
        }
        for level in levels
    ]
    rows.append(
        {"level": "all", "untrained": before["success_rate"], "trained": after["success_rate"]}
    )
    return format_table(rows, ["level", "untrained", "trained"])


def main() -> int:
    """Run the demo and print its one-line verdict last."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=str(ROOT / "configs" / "babyai-demo.yaml"))
    parser.add_argument("--workdir", default=str(ROOT / "runs" / "demo"))
    parser.add_argument("--size", action="append", default=[], help="TinyModelConfig key=value")
    parser.add_argument("overrides", nargs="*", help="config key=value overrides")
    args = parser.parse_args()

    start = time.perf_counter()
    flush_subnormals()  # before torch starts its threads (they inherit it)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    workdir = Path(args.workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    host = PluginHost()
    overrides = [
        f"model.path={workdir / 'model'}",
        f"run.output_dir={workdir / 'run'}",
        *args.overrides,
    ]
    resolved = load_config(args.config, overrides, host.registry)
    size = {k: int(v) for k, v in (item.split("=", 1) for item in args.size)}
    build_model(host, resolved, workdir / "model", size)
    print(f"model built in {time.perf_counter() - start:.0f} s", flush=True)

    results = {r.name: r for r in run_pipeline(resolved, host)}
    before, after = results["before"].metrics, results["after"].metrics
    print(per_level(before, after))
    elapsed = time.perf_counter() - start
    print(
        f"demo: held-out success {after['success_rate']:.2f} "
        f"(untrained {before['success_rate']:.2f}) in {elapsed:.0f} s"
    )
    run_dir = Path(resolved.root.run.output_dir)
    print(f"every evaluation episode, before and after, turn by turn: agentgym view {run_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
