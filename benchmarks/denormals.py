"""SFT updates with subnormal floats flushed to zero and without, on a start and a trained model.

Every stage sets flush-to-zero (`agentgym_core/numerics.py`) because a trained
model's updates slowed down on the CPU where its start model's did not. This times
it: the same SFT batches (the BabyAI moonshot's, 16 expert episodes per update) on
a start model and on a checkpoint trained from it, each in a fresh process that sets
the flag before any torch work (it is per thread; pool threads inherit it) or leaves
it off. The processes alternate, flag on and off, so machine load hits both alike.
The learning rate is tiny so the weights stay where they are over the timed updates.

    .venv/bin/python benchmarks/denormals.py --start M --trained C --expert E
    # M: runs/results/babyai-moonshot/seed0/model, C: .../seed0/sft/train/checkpoints/step-000600,
    # E: .../seed0/sft/train/expert.json (python benchmarks/results.py --scenario babyai-moonshot)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path


def child(args: argparse.Namespace) -> None:
    if args.flush:
        from agentgym_core.numerics import flush_subnormals

        flush_subnormals()  # before any torch work, so torch's pool threads inherit it
    from agentgym_algo_sft import SFT, SFTConfig
    from sft_packing import sequences

    from agentgym_core.data.agenttraj import read_items
    from agentgym_core.learner.learner import Learner
    from agentgym_core.learner.sequence import sequence_update
    from agentgym_core.learner.settings import LearnerSettings

    model, data = sequences(args.model, read_items(args.expert))
    rng = random.Random(0)
    batches = [rng.sample(data, 16) for _ in range(args.batches + 1)]
    sft = SFT(SFTConfig(files=["(given here)"]))
    learner = Learner(model, sft, LearnerSettings(lr=1e-9, micro_batch_tokens=16384, seed=0))
    seconds = []
    for batch in batches:
        start = time.perf_counter()
        sequence_update(learner, sft, [(t,) for t in batch], micro_batch_tokens=16384)
        seconds.append(time.perf_counter() - start)
    print(json.dumps({"seconds": seconds[1:]}))  # the first is a warm-up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--start", type=Path, help="the start model")
    parser.add_argument("--trained", type=Path, help="a checkpoint trained from it")
    parser.add_argument("--expert", type=Path, required=True, help="AgentTraj JSON")
    parser.add_argument("--batches", type=int, default=4, help="timed updates per process")
    parser.add_argument("--repeats", type=int, default=2, help="processes per variant")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--flush", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    models = {"start model": args.start, "trained model": args.trained}
    seconds: dict[tuple[str, bool], list[float]] = {}
    for repeat in range(args.repeats):
        for name, folder in models.items():
            for flush in (False, True) if repeat % 2 == 0 else (True, False):
                command = [sys.executable, __file__, "--child", "--model", str(folder)]
                command += ["--expert", str(args.expert), "--flush", str(int(flush))]
                command += ["--batches", str(args.batches)]
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                times = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
                seconds.setdefault((name, flush), []).extend(times)
    print(f"{args.repeats} processes per variant, {args.batches} timed updates each")
    print("| model | s / update, flag off (median) | flag on | off / on |")
    print("|---|---|---|---|")
    for name in models:
        off = statistics.median(seconds[(name, False)])
        on = statistics.median(seconds[(name, True)])
        print(f"| {name} | {off:.3f} | {on:.3f} | {off / on:.2f}x |")


if __name__ == "__main__":
    main()
