"""Does a run repeat? Train one config twice at one commit and compare what each made.

A results table is only as good as its reruns: this trains the config twice (each in
its own folder and MLflow store), evaluates each final checkpoint, and compares, in
the order data flows: the expert data an offline stage wrote (`expert.json`, by hash),
every logged training metric at every step (timings left out), the final weights
(largest absolute difference), and the evaluation's success rate. Exit status 0 when
all are equal, 1 when any differs.

    python benchmarks/repeat_check.py runs/results/webnav/seed1/sft/train/config.yaml \\
        --eval eval.split=test eval.num_tasks=160 eval.max_turns=6

Overrides after the config apply to training (`trainer.steps=20`); `--eval` ones to the
evaluation (`agentgym eval` on the same config and the final checkpoint).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentgym_core.run.checkpoint import latest_checkpoint  # noqa: E402

AGENTGYM = Path(sys.executable).with_name("agentgym")
TIMINGS = ("seconds", "tokens_per_s")
"""Metric keys holding these words are wall-clock measures, which no rerun repeats."""


def train_and_evaluate(config: str, overrides: list[str], evals: list[str], folder: Path) -> dict:
    """One run: its output folder, final checkpoint and evaluation metrics."""
    out, store = folder / "run", folder / "mlflow.db"
    where = [f"run.output_dir={out}", f"tracking.uri=sqlite:///{store}"]
    _call([str(AGENTGYM), "train", config, *overrides, *where], folder / "train.log")
    checkpoint = latest_checkpoint(out)
    if checkpoint is None:
        raise SystemExit(f"no checkpoint under {out}/checkpoints: see {folder / 'train.log'}")
    scores = folder / "eval.json"
    command = [str(AGENTGYM), "eval", config, *overrides, *evals]
    command += [f"model.path={checkpoint}", "--json", str(scores)]
    _call(command, folder / "eval.log")
    return {
        "out": out,
        "store": store,
        "checkpoint": checkpoint,
        "eval": json.loads(scores.read_text()),
    }


def _call(command: list[str], log: Path) -> None:
    with log.open("w") as sink:
        done = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(command[:3])} failed (exit {done.returncode}): see {log}")


def file_hashes(out: Path) -> dict[str, str]:
    """md5 of each data file a stage wrote (`expert.json` and the like), by relative path.

    A stage's `stage_outcome.json` is left out: it holds paths and seconds, which differ.
    """
    return {
        str(path.relative_to(out)): hashlib.md5(path.read_bytes()).hexdigest()
        for path in sorted(out.rglob("*.json"))
        if "checkpoints" not in path.parts and path.name != "stage_outcome.json"
    }


def logged_metrics(store: Path) -> dict[tuple[str, int], float]:
    """Every training metric the run logged, by (key, step), timings left out."""
    with sqlite3.connect(store) as db:
        rows = db.execute("SELECT key, step, value FROM metrics").fetchall()
    return {(key, step): value for key, step, value in rows if not any(t in key for t in TIMINGS)}


def weight_difference(first: Path, second: Path) -> float:
    """The largest absolute difference between two checkpoints' weights (inf: other names)."""
    from safetensors.torch import load_file

    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    if a.keys() != b.keys():
        return float("inf")
    return max(float((a[name].double() - b[name].double()).abs().max()) for name in a)


def compare(first: dict, second: dict) -> list[tuple[str, str, str, bool]]:
    """Rows of (what, first run, second run, equal)."""
    rows = []
    hashes = file_hashes(first["out"]), file_hashes(second["out"])
    for name in sorted(set(hashes[0]) | set(hashes[1])):
        one, two = hashes[0].get(name, "missing"), hashes[1].get(name, "missing")
        rows.append((name, one[:12], two[:12], one == two))
    metrics = logged_metrics(first["store"]), logged_metrics(second["store"])
    differing = sorted(
        k for k in set(metrics[0]) | set(metrics[1]) if metrics[0].get(k) != metrics[1].get(k)
    )
    first_diff = f"first: {differing[0][0]} at step {differing[0][1]}" if differing else "none"
    rows.append(
        (
            "logged metrics (key, step)",
            f"{len(metrics[0])} values",
            f"{len(metrics[1])} values, {len(differing)} differ ({first_diff})",
            not differing,
        )
    )
    gap = weight_difference(first["checkpoint"], second["checkpoint"])
    rows.append(("final weights", first["checkpoint"].name, f"max |difference| {gap:g}", gap == 0))
    one, two = first["eval"]["success_rate"], second["eval"]["success_rate"]
    rows.append(("evaluation success rate", f"{one:.4f}", f"{two:.4f}", one == two))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("config", help="a run config (YAML) with a training stage")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for both runs")
    parser.add_argument("--eval", nargs="*", default=[], help="key=value for the evaluation")
    parser.add_argument("--keep", help="keep both runs in this folder (default: a temp one)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        root = Path(args.keep or scratch)
        runs = []
        for name in ("first", "second"):
            (root / name).mkdir(parents=True, exist_ok=True)
            runs.append(train_and_evaluate(args.config, args.overrides, args.eval, root / name))
        rows = compare(*runs)
    width = max(len(row[0]) for row in rows)
    for what, one, two, equal in rows:
        print(f"{what:<{width}}  {'equal ' if equal else 'DIFFER'}  {one}  |  {two}")
    repeated = all(row[3] for row in rows)
    print("the run repeated" if repeated else "the run did not repeat")
    sys.exit(0 if repeated else 1)


if __name__ == "__main__":
    main()
