"""Episodes per second against the size of the env-server pool, with a slow env.

Each server is `agentgym serve-env babyai --threads 1 --step-latency-ms 100`:
one env call at a time, as AgentGym's single-worker servers run, each reset
and step 100 ms longer. The client is the `remote` env with every server in
`base_urls`, `--sessions` instances in threads (as the rollout engine's env
threads are), each playing episodes of random listed actions (seeded) up to
`--turns` steps. Pools of 1, 2 and 4 servers run interleaved, `--repeats`
times each, the servers started before the clock runs. What it shows: how
throughput scales with servers when the env, not the model, is the bottleneck;
no model runs here.

    .venv/bin/python benchmarks/env_pool.py --pools 1 2 4 --repeats 3
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from serve_load import free_port  # noqa: E402 - benchmarks/ is the script's folder

LEVELS = "[GoToObj,GoToLocal,OpenDoor,PickupDist]"


def start_servers(n: int, latency_ms: float) -> tuple[list[subprocess.Popen], list[str]]:
    """`n` single-worker serve-env processes with the injected latency, once all answer."""
    processes, urls = [], []
    for _ in range(n):
        port = free_port()
        command = [sys.executable, "-m", "agentgym_core.cli", "serve-env", "babyai"]
        command += ["--port", str(port), "--threads", "1", "--log-level", "warning"]
        command += ["--step-latency-ms", str(latency_ms), "--env-option", f"levels={LEVELS}"]
        processes.append(subprocess.Popen(command))
        urls.append(f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 120
    for url, process in zip(urls, processes, strict=True):
        while True:
            try:
                httpx.get(f"{url}/info", timeout=1)
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("serve-env did not start") from None
                time.sleep(0.2)
    return processes, urls


def episodes(env, count: int, turns: int, seed: int) -> int:
    """Play `count` episodes of at most `turns` random listed actions; returns env errors."""
    rng = random.Random(seed)
    errors = 0
    for episode in range(count):
        try:
            env.reset(seed * 1000 + episode)
            for _ in range(turns):
                result = env.step(rng.choice(env.valid_actions() or ["turn left"]))
                if result.done or result.truncated:
                    break
        except Exception as error:  # noqa: BLE001 - counted, reported
            errors += 1
            print(f"episode {episode}: {error}", file=sys.stderr)
    return errors


def measure(urls: list[str], sessions: int, per_session: int, turns: int) -> tuple[float, int]:
    """Episodes per second of `sessions` client threads over the pool, and env errors."""
    from agentgym_env_remote import RemoteConfig, RemoteEnv

    config = RemoteConfig(
        env="agentgym", base_urls=urls, timeout_s=120, train_tasks=[0], test_tasks=[1]
    )
    envs = [RemoteEnv(config) for _ in range(sessions)]
    begin = time.perf_counter()
    with ThreadPoolExecutor(sessions) as threads:
        errors = sum(
            threads.map(lambda i: episodes(envs[i], per_session, turns, i), range(sessions))
        )
    seconds = time.perf_counter() - begin
    for env in envs:
        env.close()
    return sessions * per_session / seconds, errors


def main() -> None:
    """Interleaved repeats over the pool sizes; a table of medians."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--sessions", type=int, default=16, help="client env instances")
    parser.add_argument("--episodes", type=int, default=4, help="episodes per session")
    parser.add_argument("--turns", type=int, default=5, help="steps per episode at most")
    parser.add_argument("--latency-ms", type=float, default=100.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rates: dict[int, list[float]] = {n: [] for n in args.pools}
    errors = dict.fromkeys(args.pools, 0)
    for _ in range(args.repeats):
        for n in args.pools:  # interleaved: every pool size once per repeat
            processes, urls = start_servers(n, args.latency_ms)
            try:
                measure(urls, n, 1, 1)  # warm-up: imports, first connections
                rate, failed = measure(urls, args.sessions, args.episodes, args.turns)
            finally:
                for process in processes:
                    process.terminate()
                    process.wait(30)
            rates[n].append(rate)
            errors[n] += failed
    base = statistics.median(rates[args.pools[0]])
    print(
        f"{args.sessions} client sessions x {args.episodes} episodes of up to {args.turns} steps; "
        f"{args.latency_ms:g} ms per reset and step; single-worker servers\n"
    )
    print("| servers | episodes / s (median) | / 1 server | runs | env errors |")
    print("|---|---|---|---|---|")
    for n in args.pools:
        rate = statistics.median(rates[n])
        runs = ", ".join(f"{r:.2f}" for r in rates[n])
        print(f"| {n} | {rate:.2f} | {rate / base:.2f}x | {runs} | {errors[n]} |")


if __name__ == "__main__":
    main()
