"""ScienceWorld step latency: the package's `step` against stepping its server directly.

`scienceworld.ScienceWorldEnv.step` also enumerates every valid action and
reads the room, the inventory and the task text on each call. The sciworld
plugin steps the py4j server directly (`step`, then score, completed flag and
move count) and enumerates valid actions only when asked. Measured in one run,
on the same action sequences (the gold paths of the first test variations of
each type, cut at `--max-steps` actions):

- `package step`: `ScienceWorldEnv.step` (its own JVM, the package's options);
- `server step`: the plugin's four calls on that same JVM and server;
- `SciWorldEnv.step`: the plugin end to end (worker process, socket, its JVM options),
  with `deterministic` on (the default) and off;
- `SciWorldEnv.valid_actions()`: one enumeration, what it costs when it is asked for
  (`list_valid_actions: true`).

Then the resident memory of the plugin's worker plus its JVM while one worker
plays many episodes (what `recycle_after` bounds).

    .venv/bin/python benchmarks/sciworld_step.py --variations 2 --memory-episodes 0
    .venv/bin/python benchmarks/sciworld_step.py --memory-only --memory-episodes 1200
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import psutil


def median_ms(values: Sequence[float]) -> float:
    """Median of seconds, in milliseconds."""
    return statistics.median(values) * 1000.0


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of `ys` against `xs`."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    num = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    return num / sum((x - mean_x) ** 2 for x in xs)


def gold_paths(package_env, types: Sequence[str], variations: int, max_steps: int) -> list:
    """(type, variation, actions) for the first `variations` test variations of each type."""
    episodes = []
    for task_type in types:
        package_env.load(task_type, 0)
        for variation in package_env.get_variations_test()[:variations]:
            package_env.load(task_type, variation, generateGoldPath=True)
            path = package_env.get_gold_action_sequence()[:max_steps]
            episodes.append((task_type, variation, path))
    return episodes


def time_steps(reset: Callable[[str, int], None], step: Callable[[str], None], episodes) -> list:
    """Seconds of every step of every episode."""
    times = []
    for task_type, variation, path in episodes:
        reset(task_type, variation)
        for action in path:
            start = time.perf_counter()
            step(action)
            times.append(time.perf_counter() - start)
    return times


def package_rows(types: Sequence[str], args: argparse.Namespace) -> tuple[list, dict]:
    """Package step, server step and valid-action enumeration, all on the package's JVM."""
    from scienceworld import ScienceWorldEnv

    env = ScienceWorldEnv("", envStepLimit=10**6)
    try:
        episodes = gold_paths(env, types, args.variations, args.max_steps)
        server = env.server

        def reset(task_type: str, variation: int) -> None:
            env.load(task_type, variation)
            env.step("look around")  # what env.reset() does after server.reset(), a reload

        def server_step(action: str) -> None:
            server.step(action)
            server.getScore(), server.getCompleted(), server.getNumMoves()

        times = {"package step": [], "server step": []}
        for _ in range(args.repeats):  # interleaved, so load drift hits both alike
            times["package step"] += time_steps(reset, env.step, episodes)
            times["server step"] += time_steps(reset, server_step, episodes)
    finally:
        env.close()
    return episodes, times


def plugin_times(episodes, deterministic: bool, repeats: int) -> tuple[list, list]:
    """Seconds of `SciWorldEnv.step`, and of `valid_actions()` after each step."""
    from agentgym_env_sciworld import SciWorldConfig, SciWorldEnv
    from agentgym_env_sciworld.tasks import encode

    types = sorted({task_type for task_type, _, _ in episodes})
    config = SciWorldConfig(tasks=types, deterministic=deterministic, list_valid_actions=True)
    env = SciWorldEnv(config)
    valid: list[float] = []

    def step_then_list(action: str) -> None:
        env.step(action)
        start = time.perf_counter()
        env.valid_actions()
        valid.append(time.perf_counter() - start)

    try:
        steps = []
        for _ in range(repeats):
            steps += time_steps(lambda t, v: env.reset(encode(t, v)), env.step, episodes)
        time_steps(lambda t, v: env.reset(encode(t, v)), step_then_list, episodes)
    finally:
        env.close()
    return steps, valid


def memory(episodes, count: int, every: int) -> list[tuple[int, float]]:
    """(episodes played, RSS MiB of worker + JVM) while one worker replays the episodes."""
    from agentgym_env_sciworld import SciWorldConfig, SciWorldEnv
    from agentgym_env_sciworld.tasks import encode

    types = sorted({task_type for task_type, _, _ in episodes})
    env = SciWorldEnv(SciWorldConfig(tasks=types, recycle_after=count + 1))
    samples = []
    try:
        for i in range(1, count + 1):
            task_type, variation, path = episodes[i % len(episodes)]
            env.reset(encode(task_type, variation))
            for action in path:
                env.step(action)
            if i == 1 or i % every == 0:
                pids = (env.worker.pid, env.worker.jvm_pid)
                rss = sum(psutil.Process(p).memory_info().rss for p in pids)
                samples.append((i, rss / 2**20))
    finally:
        env.close()
    return samples


def latency_table(args: argparse.Namespace) -> list:
    """Measure the step paths, print their table; returns the episodes played."""
    episodes, times = package_rows(args.types, args)
    steps, valid = plugin_times(episodes, True, args.repeats)
    times["SciWorldEnv.step (deterministic)"] = steps
    unordered, _ = plugin_times(episodes, False, args.repeats)
    times["SciWorldEnv.step (deterministic: false)"] = unordered
    times["SciWorldEnv.valid_actions() (when asked)"] = valid
    base = median_ms(times["package step"])
    print(f"{len(episodes)} episodes, {len(times['server step'])} timed steps per row\n")
    print("| path | steps | median ms | p90 ms | package step / this |")
    print("|---|---|---|---|---|")
    for name, values in times.items():
        p90 = statistics.quantiles(values, n=10)[-1] * 1000.0
        ratio = base / median_ms(values)
        print(f"| {name} | {len(values)} | {median_ms(values):.2f} | {p90:.2f} | {ratio:.1f}x |")
    return episodes


def main(argv: Sequence[str] | None = None) -> None:
    """Measure and print the tables."""
    from agentgym_env_sciworld.tasks import DEFAULT_TASK_TYPES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--types", nargs="*", default=list(DEFAULT_TASK_TYPES))
    parser.add_argument("--variations", type=int, default=2, help="test variations per type")
    parser.add_argument("--max-steps", type=int, default=30, help="gold actions per episode")
    parser.add_argument("--repeats", type=int, default=2, help="passes over the episodes")
    parser.add_argument("--memory-episodes", type=int, default=300, help="0: no memory table")
    parser.add_argument("--memory-every", type=int, default=100, help="sample RSS every N")
    parser.add_argument("--memory-only", action="store_true", help="skip the latency table")
    args = parser.parse_args(argv)

    if args.memory_only:
        from scienceworld import ScienceWorldEnv

        package_env = ScienceWorldEnv("")
        episodes = gold_paths(package_env, args.types, args.variations, args.max_steps)
        package_env.close()
    else:
        episodes = latency_table(args)
    if args.memory_episodes:
        samples = memory(episodes, args.memory_episodes, args.memory_every)
        print("\n| episodes played by one worker | worker + JVM RSS MiB |")
        print("|---|---|")
        for played, mib in samples:
            print(f"| {played} | {mib:.0f} |")
        xs, ys = zip(*samples, strict=True)
        print(f"\ngrowth: {slope(xs, ys) * 1024:.0f} KiB/episode (least squares over the samples)")


if __name__ == "__main__":
    main()
