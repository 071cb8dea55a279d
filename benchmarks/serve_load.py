"""Env server load: N concurrent sessions against one `agentgym serve-env babyai`.

The server runs as its own process (the real command line); each session is a
`remote` env in a client thread, taking random listed actions (seeded) and
starting the next task when an episode ends. Reported per concurrency: steps
per second (reset and step calls both count), errors, and sessions left open
on the server at the end. The in-process row plays the same env in one thread
with no HTTP, for the overhead ratio.

    .venv/bin/python benchmarks/serve_load.py --sessions 1 16 64 --steps 30 --repeats 3
"""

from __future__ import annotations

import argparse
import random
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

LEVELS = "[GoToObj,GoToLocal,OpenDoor,PickupDist]"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(port: int, threads: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "agentgym_core.cli", "serve-env", "babyai"]
    command += ["--port", str(port), "--threads", str(threads), "--log-level", "warning"]
    command += ["--env-option", f"levels={LEVELS}"]
    process = subprocess.Popen(command)
    deadline = time.monotonic() + 120
    while True:
        try:
            httpx.get(f"http://127.0.0.1:{port}/info", timeout=1)
            return process
        except httpx.TransportError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("serve-env did not start") from None
            time.sleep(0.2)


def play(env, steps: int, seed: int) -> int:
    """`steps` calls (resets included) of random listed actions; returns the calls made."""
    rng = random.Random(seed)
    task, calls = seed * 1000, 0
    env.reset(task)
    calls += 1
    while calls < steps:
        result = env.step(rng.choice(env.valid_actions() or ["turn left"]))
        calls += 1
        if result.done or result.truncated:
            task += 1
            env.reset(task)
            calls += 1
    return calls


def remote_round(url: str, sessions: int, steps: int) -> tuple[float, int]:
    from agentgym_env_remote import RemoteConfig, RemoteEnv

    config = RemoteConfig(
        env="agentgym",
        base_urls=[url],
        max_concurrency=sessions,
        timeout_s=120,
        train_tasks=[0],
        test_tasks=[1],
    )
    envs = [RemoteEnv(config) for _ in range(sessions)]
    errors = 0

    def run(index: int) -> int:
        nonlocal errors
        try:
            return play(envs[index], steps, index)
        except Exception as error:  # noqa: BLE001 - counted, reported
            errors += 1
            print(f"session {index}: {error}", file=sys.stderr)
            return 0

    begin = time.perf_counter()
    with ThreadPoolExecutor(sessions) as pool:
        calls = sum(pool.map(run, range(sessions)))
    seconds = time.perf_counter() - begin
    for env in envs:
        env.close()
    return calls / seconds, errors


def local_round(steps: int) -> float:
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    env = BabyAIEnv(BabyAIConfig(levels=LEVELS.strip("[]").split(",")))
    begin = time.perf_counter()
    calls = play(env, steps, 0)
    return calls / (time.perf_counter() - begin)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--steps", type=int, default=30, help="calls per session")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=16, help="server env threads")
    args = parser.parse_args()
    port = free_port()
    server = start_server(port, args.threads)
    url = f"http://127.0.0.1:{port}"
    try:
        local_round(args.steps)  # warm-up: imports, level generation caches
        local = statistics.median(local_round(args.steps * 4) for _ in range(args.repeats))
        rows = []
        for sessions in args.sessions:
            remote_round(url, sessions, 5)  # warm-up
            results = [remote_round(url, sessions, args.steps) for _ in range(args.repeats)]
            rate = statistics.median(r for r, _ in results)
            errors = sum(e for _, e in results)
            open_sessions = httpx.get(f"{url}/info").json()["sessions"]
            rows.append((sessions, rate, errors, open_sessions))
    finally:
        server.terminate()
        server.wait(30)
    print("| sessions | env calls/s (median) | / in-process | errors | sessions open after |")
    print("|---|---|---|---|---|")
    print(f"| in-process, 1 thread | {local:.0f} | 1.00x | 0 | - |")
    for sessions, rate, errors, open_sessions in rows:
        print(f"| {sessions} | {rate:.0f} | {rate / local:.2f}x | {errors} | {open_sessions} |")


if __name__ == "__main__":
    main()
