"""What one environment costs: reset and step latency, and memory growth per episode.

For any installed environment, by its registered name. Each environment runs
in its own fresh process (so memory numbers are its own and a crash is
reported, not fatal). Actions come from the env's expert where it has one,
else a seeded random pick of `valid_actions()`, else a fixed action. Reported:
reset and step latency (median, p90), `valid_actions()` latency, the share of
episodes solved by that action source, resident memory after warm-up, and its
growth per episode (least-squares slope of RSS, sampled every `--rss-every`
episodes after warm-up: a leak shows as a slope that stays well above zero
however many episodes run).

    .venv/bin/python benchmarks/envs.py --env babyai --env textcraft --episodes 400
    .venv/bin/python benchmarks/envs.py -o babyai.levels=[GoToObj]   # every installed env
    .venv/bin/python benchmarks/envs.py --env textcraft --inject-leak-kib 10   # self-check
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
from array import array
from collections.abc import Sequence
from typing import Any

COLUMNS = [
    ("env", "env"),
    ("action source", "actions"),
    ("episodes", "episodes"),
    ("steps", "steps"),
    ("solved", "solved"),
    ("reset median ms", "reset_ms_median"),
    ("reset p90 ms", "reset_ms_p90"),
    ("step median ms", "step_ms_median"),
    ("step p90 ms", "step_ms_p90"),
    ("valid_actions median ms", "valid_ms_median"),
    ("RSS MiB", "rss_mib"),
    ("RSS growth KiB/episode", "rss_kib_per_episode"),
]


def rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc, else psutil)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import psutil

        return psutil.Process().memory_info().rss


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of `ys` against `xs` (memory growth per episode)."""
    if len(xs) < 2:
        return 0.0
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    num = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    return num / sum((x - mean_x) ** 2 for x in xs)


class Samples:
    """Latencies in a preallocated array: the harness itself must not grow per episode."""

    def __init__(self, capacity: int) -> None:
        self.values = array("d", bytes(8 * capacity))
        self.count = 0

    def add(self, seconds: float) -> None:
        """Record one latency (seconds)."""
        self.values[self.count] = seconds
        self.count += 1

    def ms(self) -> list[float]:
        """The recorded latencies, in milliseconds."""
        return [v * 1000.0 for v in self.values[: self.count]]


class LeakyEnv:
    """Wraps an env and keeps `kib` KiB per reset: checks that the growth column sees leaks."""

    def __init__(self, env: Any, kib: float) -> None:
        self.env, self.size, self.kept = env, int(kib * 1024), []

    def reset(self, task: int) -> str:  # noqa: D102
        self.kept.append(bytearray(self.size))
        return self.env.reset(task)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)


class ActionSource:
    """Expert, random valid action, or a fixed action, as `mode` says (`auto` picks the first)."""

    def __init__(self, env: Any, mode: str, fixed: str, seed: int) -> None:
        self.env, self.fixed, self.rng = env, fixed, random.Random(seed)
        if mode == "auto":
            mode = "expert" if callable(getattr(env, "expert_action", None)) else "valid"
        self.mode = mode

    def __call__(self, valid: list[str] | None) -> str:
        if self.mode == "expert":
            return self.env.expert_action()
        if self.mode == "valid" and valid:
            return self.rng.choice(valid)
        return self.fixed

    @property
    def label(self) -> str:
        """What the table shows."""
        return "random valid" if self.mode == "valid" else self.mode


def play_episode(env: Any, task: int, source: ActionSource, max_steps: int, out: dict) -> None:
    """One episode; records its latencies in `out` and counts a success."""
    start = time.perf_counter()
    env.reset(task)
    out["reset"].add(time.perf_counter() - start)
    for _ in range(max_steps):
        start = time.perf_counter()
        valid = env.valid_actions()
        out["valid"].add(time.perf_counter() - start)
        action = source(valid)
        start = time.perf_counter()
        result = env.step(action)
        out["step"].add(time.perf_counter() - start)
        if result.done or result.truncated:
            out["solved"] += bool(result.info.get("success", result.reward > 0))
            return


def new_stats(episodes: int, max_steps: int) -> dict[str, Any]:
    """Empty latency records for `episodes` episodes of at most `max_steps` steps."""
    steps = episodes * max_steps
    return {
        "reset": Samples(episodes),
        "valid": Samples(steps),
        "step": Samples(steps),
        "solved": 0,
    }


def measure(name: str, options: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Build env `name` in this process and measure it (see the module docstring)."""
    from agentgym_core.plugins import PluginHost

    registration = PluginHost().registry.get("environment", name)
    env = registration.factory(registration.config.model_validate(options))
    if args.inject_leak_kib:
        env = LeakyEnv(env, args.inject_leak_kib)
    try:
        tasks = list(env.tasks(args.split))
        source = ActionSource(env, args.actions, args.fixed_action, args.seed)
        scratch = new_stats(args.warmup, args.max_steps)
        for i in range(args.warmup):  # first-use costs (imports, caches) are not per episode
            play_episode(env, tasks[i % len(tasks)], source, args.max_steps, scratch)
        stats = new_stats(args.episodes, args.max_steps)
        episodes, rss = array("d"), array("d")
        for i in range(args.episodes):
            play_episode(env, tasks[(args.warmup + i) % len(tasks)], source, args.max_steps, stats)
            if i % args.rss_every == 0 or i == args.episodes - 1:
                gc.collect()  # slow with a large heap: only where RSS is sampled
                episodes.append(i)
                rss.append(rss_bytes())
    finally:
        env.close()
    reset, step, valid = stats["reset"].ms(), stats["step"].ms(), stats["valid"].ms()
    return {
        "env": name,
        "actions": source.label,
        "episodes": args.episodes,
        "steps": len(step),
        "solved": f"{stats['solved'] / args.episodes:.2f}",
        "reset_ms_median": statistics.median(reset),
        "reset_ms_p90": percentile(reset, 0.9),
        "step_ms_median": statistics.median(step),
        "step_ms_p90": percentile(step, 0.9),
        "valid_ms_median": statistics.median(valid),
        "rss_mib": rss[0] / 2**20,
        "rss_kib_per_episode": slope(episodes, rss) / 1024,
    }


def env_options(pairs: Sequence[str], name: str) -> dict[str, Any]:
    """`NAME.key=value` pairs for env `name`, values parsed as YAML (as `-o` elsewhere)."""
    import yaml

    options: dict[str, Any] = {}
    for pair in pairs:
        target, sep, value = pair.partition("=")
        env, dot, key = target.partition(".")
        if not sep or not dot:
            raise SystemExit(f"expected NAME.key=value, got {pair!r}")
        if env == name:
            options[key] = yaml.safe_load(value)
    return options


def run_child(name: str, argv: Sequence[str]) -> dict[str, Any]:
    """Measure `name` in a fresh interpreter; an error is returned as a row, not raised."""
    command = [sys.executable, __file__, "--child", name, *argv]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        error = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"env": name, "actions": f"error: {error}"}
    return json.loads(lines[-1])


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of the measured rows."""

    def cell(value: Any) -> str:
        return f"{value:.2f}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(title for title, _ in COLUMNS) + " |"]
    lines.append("|" + "---|" * len(COLUMNS))
    for row in rows:
        lines.append("| " + " | ".join(cell(row.get(key, "")) for _, key in COLUMNS) + " |")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", action="append", help="env name (repeat); default: every one")
    parser.add_argument("-o", "--option", action="append", default=[], help="NAME.key=value")
    parser.add_argument("--episodes", type=int, default=300, help="measured episodes per env")
    parser.add_argument("--warmup", type=int, default=10, help="episodes played first, unmeasured")
    parser.add_argument("--max-steps", type=int, default=30, help="steps per episode at most")
    parser.add_argument("--split", default="train", choices=["train", "test"])
    parser.add_argument("--actions", default="auto", choices=["auto", "expert", "valid", "fixed"])
    parser.add_argument("--fixed-action", default="look", help="the action of --actions fixed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rss-every", type=int, default=10, help="sample RSS every N episodes")
    parser.add_argument(
        "--inject-leak-kib", type=float, default=0.0, help="self-check: leak this much per reset"
    )
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def child_argv(args: argparse.Namespace) -> list[str]:
    """The options a child process needs, besides `--child NAME`."""
    argv = [f"--episodes={args.episodes}", f"--warmup={args.warmup}"]
    argv += [f"--max-steps={args.max_steps}", f"--split={args.split}", f"--seed={args.seed}"]
    argv += [f"--rss-every={args.rss_every}", f"--inject-leak-kib={args.inject_leak_kib}"]
    argv += [f"--actions={args.actions}", f"--fixed-action={args.fixed_action}"]
    return argv + [f"--option={pair}" for pair in args.option]


def main(argv: Sequence[str] | None = None) -> None:
    """Measure each env in its own process and print the table."""
    args = parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, env_options(args.option, args.child), args)))
        return
    if args.env:
        names = args.env
    else:
        from agentgym_core.plugins import PluginHost

        names = PluginHost().registry.names("environment")
    rows = []
    for name in names:
        rows.append(run_child(name, child_argv(args)))
        print(f"{name}: {json.dumps(rows[-1])}", file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=2)


if __name__ == "__main__":
    main()
