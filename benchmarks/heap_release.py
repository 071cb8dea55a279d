"""Resident memory between cloning updates of SmolLM2: freed heap pages given back, or kept.

The learner ends every update with `Learner.finish_update`, which on a CPU gives
the heap's freed pages back to the system (`agentgym_core/heap.py`). Arms:
`release` (as the code is) and `kept` (that call made a no-op, as before).
Each runs `benchmarks/smollm2-sft-memory.yaml`'s cloning updates (LoRA on bf16
SmolLM2, 8 expert episodes an update) in a fresh process, the arms interleaved
per repeat; a hook reads the resident size after every update, and the peak
comes from `getrusage`.

    .venv/bin/python benchmarks/heap_release.py --repeats 1 --updates 12

Takes the model from `agentgym model fetch smollm2-135m-instruct` (the cache).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.memory import peak_rss_mib, rss_mib  # noqa: E402

CONFIG = Path(__file__).with_name("smollm2-sft-memory.yaml")
ARMS = ("release", "kept")


def run_arm(arm: str, updates: int, micro_batch_tokens: int) -> dict:
    """Child process: the cloning updates of `arm`; resident MiB after each, and the peak."""
    import agentgym_core.learner.learner as learner
    from agentgym_core import hookimpl
    from agentgym_core.config.load import load_config
    from agentgym_core.modeling.fetch import fetch
    from agentgym_core.plugins import PluginHost
    from agentgym_core.run.kinds import run_stage

    if arm == "kept":
        learner.release_freed_memory = lambda: None
    after_update: list[float] = []

    class Reader:
        @hookimpl
        def agentgym_after_update(self, step: int, metrics: dict) -> None:
            after_update.append(round(rss_mib()))

    host = PluginHost(extra_plugins={"heap-release-reader": Reader()})
    with tempfile.TemporaryDirectory() as out:
        overrides = [
            f"model.path={fetch('smollm2-135m-instruct', log=None)}",
            f"run.output_dir={out}",
            f"trainer.steps={updates}",
            f"trainer.micro_batch_tokens={micro_batch_tokens}",
            f"algorithm.expert.episodes={max(16, 4 * updates)}",
        ]
        run_stage(load_config(CONFIG, overrides, host.registry), host, show_progress=False)
    return {"arm": arm, "after_update_mib": after_update, "peak_mib": round(peak_rss_mib())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--updates", type=int, default=12)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # a child process
    args = parser.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args.arm, args.updates, args.micro_batch_tokens)))
        return
    print("| repeat | arm | peak RSS MiB | RSS after each update, MiB |")
    print("| --- | --- | --- | --- |")
    for repeat in range(args.repeats):
        for arm in ARMS:
            command = [sys.executable, __file__, "--arm", arm, "--updates", str(args.updates)]
            command += ["--micro-batch-tokens", str(args.micro_batch_tokens)]
            out = subprocess.run(command, check=True, capture_output=True, text=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            series = ", ".join(str(v) for v in row["after_update_mib"])
            print(f"| {repeat} | {arm} | {row['peak_mib']} | {series} |", flush=True)


if __name__ == "__main__":
    main()
