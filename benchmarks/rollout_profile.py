"""Where a rollout's time goes: one update's episodes of the demo, timed by part.

The demo's config (`configs/babyai-demo.yaml`: 16 tasks x 8 samples, the `hf`
policy batching up to 128 requests) and a model: a fresh demo model, or a
checkpoint (`--model`; the demo's trained one plays episodes as long as
training's). Each repeat plays the episodes of one update (update `repeat`'s
tasks and seeds) at `--turns`, and prints its wall time beside the generation
thread's time by part (`HFPolicy.counters()`: KV rows gathered and stored,
prefill, one-token decode passes, sampling), the time the generation thread
sat idle (waiting for env steps and the event loop), and the env calls'
summed time (on `rollout.env_threads` threads, so more than their wall time).

    make demo    # its trained checkpoint plays training-length episodes
    .venv/bin/python benchmarks/rollout_profile.py \\
        --model runs/demo/run/train/checkpoints/step-000100 --turns 10 --repeats 5

Config overrides after the options try other settings (`rollout.env_threads=1`).
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
from agentgym_core.numerics import flush_subnormals  # noqa: E402
from agentgym_core.plugins import PluginHost  # noqa: E402
from agentgym_core.rollout.engine import EpisodeSpec  # noqa: E402
from agentgym_core.run.components import build_components, load_configured_model  # noqa: E402
from agentgym_core.run.rollout_step import (  # noqa: E402
    make_engine,
    rollout_settings,
    sample_tasks,
    step_seed,
)
from agentgym_core.tracking.console import format_table  # noqa: E402
from examples.babyai_demo import build_model  # noqa: E402

CONFIG = ROOT / "configs" / "babyai-demo.yaml"
PARTS = ("kv_cache", "prefill", "decode", "sampling")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", help="a checkpoint; default: a fresh demo model")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("overrides", nargs="*", help="config key=value (rollout.env_threads=2)")
    args = parser.parse_args()

    flush_subnormals()  # as the demo does, before torch starts its threads
    host = PluginHost()
    with tempfile.TemporaryDirectory() as scratch:
        model_path = args.model or str(Path(scratch) / "model")
        overrides = [f"model.path={model_path}", *args.overrides]
        resolved = load_config(CONFIG, overrides, host.registry)
        if args.model is None:
            build_model(host, resolved, Path(model_path), {})
        rows = profile(resolved, args.turns, args.repeats)
    print(format_table(rows, list(rows[0])))
    walls = [row["wall s"] for row in rows]
    busy = [row["gen busy s"] for row in rows]
    print(
        f"median over {len(rows)} rollouts: wall {statistics.median(walls):.2f} s, "
        f"generation thread busy {statistics.median(busy):.2f} s"
    )


def profile(resolved, turns: int, repeats: int) -> list[dict[str, float]]:
    """One row per repeat: wall time, episodes' turns, generation by part, env time."""
    root = resolved.root
    components = build_components(resolved)
    model, tokenizer = load_configured_model(root.model)
    policy = components.policy_factory(model, tokenizer)
    engine = make_engine(components, policy, tokenizer, model, root)
    env = components.env_factory()
    try:
        train_tasks = list(env.tasks("train"))
    finally:
        env.close()
    rows = []
    try:
        for repeat in range(repeats):
            seed = step_seed(root.run.seed, repeat)
            tasks = sample_tasks(train_tasks, root.trainer.tasks_per_step, seed)
            episodes = [
                EpisodeSpec(task_id=task, group=index, sample=sample)
                for index, task in enumerate(tasks)
                for sample in range(root.trainer.group_size)
            ]
            before, env_before = policy.counters(), engine.env_seconds
            sizes_before = len(policy.batch_sizes)
            start = time.perf_counter()
            played = engine.run(episodes, rollout_settings(root, max_turns=turns, seed=seed))
            wall = time.perf_counter() - start
            after = policy.counters()
            parts = {p: after[f"{p}_seconds"] - before.get(f"{p}_seconds", 0.0) for p in PARTS}
            sizes = policy.batch_sizes[sizes_before:]
            rows.append(
                {
                    "wall s": wall,
                    "turns": sum(len(t.turns) for t in played) / len(played),
                    "gen busy s": sum(parts.values()),
                    **{f"{part} s": seconds for part, seconds in parts.items()},
                    "gen idle s": wall - sum(parts.values()),
                    "batches": len(sizes),
                    "mean rows": sum(sizes) / len(sizes),
                    "env calls s (summed)": engine.env_seconds - env_before,
                }
            )
    finally:
        engine.close()
        policy.close()
    return rows


if __name__ == "__main__":
    main()
