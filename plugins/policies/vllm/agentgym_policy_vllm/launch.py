"""`agentgym serve-policy MODEL --replicas N`: stock `vllm serve` processes for `vllm_server`.

A thin launcher: one vLLM OpenAI-compatible server per replica on consecutive
ports, with what the policy needs: the action-mask logits processor,
log-probabilities after it (`processed_logprobs`), no sampling defaults from
the checkpoint's `generation_config.json` (`--generation-config vllm`), and
the dev endpoints that reload weights in place (`VLLM_SERVER_DEV_MODE=1`). The command it runs is
printed, so a user can start replicas by hand or on other hosts instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

import httpx

POLICY_FLAGS = [
    "--logits-processors",
    "agentgym_policy_vllm.logits:ActionTrieProcessor",
    "--logprobs-mode",
    "processed_logprobs",
    "--generation-config",
    "vllm",
]
"""What `vllm_server` relies on: the action constraint, log-probabilities after it, and
vLLM's neutral sampling defaults (a real checkpoint's `generation_config.json` often sets
top_k and top_p, which vLLM would apply to any parameter a request leaves out)."""


def replica_command(model: str, port: int, host: str, extra: Sequence[str]) -> list[str]:
    """The `vllm serve` command line of one replica.

    As `python -m`: the CPU build's `vllm` script looks for a package named `vllm` and fails.
    """
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model]
    return [*command, "--host", host, "--port", str(port), *POLICY_FLAGS, *extra]


def replica_env() -> dict[str, str]:
    """The environment of a replica: dev endpoints on; on CPU, no pinning of OpenMP threads."""
    env = dict(os.environ, VLLM_SERVER_DEV_MODE="1")
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return env


def start_replicas(
    model: str,
    replicas: int,
    port: int,
    *,
    host: str = "127.0.0.1",
    extra: Sequence[str] = (),
    timeout_s: float = 600.0,
    log=None,
) -> tuple[list[subprocess.Popen], list[str]]:
    """Start the replicas and wait until each answers /health; returns processes and URLs."""
    processes, urls = [], []
    for index in range(replicas):
        command = replica_command(model, port + index, host, extra)
        # its own process group: stopping it reaches vLLM's engine-core child too
        processes.append(
            subprocess.Popen(
                command, env=replica_env(), stdout=log, stderr=log, start_new_session=True
            )
        )
        urls.append(f"http://{host}:{port + index}")
    deadline = time.monotonic() + timeout_s
    for url, process in zip(urls, processes, strict=True):
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                stop(processes)
                raise RuntimeError(
                    f"vLLM replica {url} did not start (exit {process.poll()}): "
                    + " ".join(replica_command(model, 0, host, extra))
                )
            time.sleep(0.5)
    return processes, urls


def signal_replica(process: subprocess.Popen, sig: int) -> None:
    """Send `sig` to a replica's process group (the server and its engine core)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


def stop(processes: Sequence[subprocess.Popen], grace_s: float = 30.0) -> None:
    """Terminate every replica; kill what is still running `grace_s` later (all together)."""
    for process in processes:
        signal_replica(process, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        signal_replica(process, signal.SIGKILL)  # an engine core left behind, if any


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(model: str, replicas: int, port: int, host: str, extra: Sequence[str]) -> int:
    """Start, print the URLs and the config block, serve until interrupted.

    SIGINT and SIGTERM both stop the replicas first (a shell's background job
    starts with SIGINT ignored, so only SIGTERM would reach it otherwise).
    """
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    print("each replica runs: " + " ".join(replica_command(model, port, host, extra)), flush=True)
    processes, urls = start_replicas(model, replicas, port, host=host, extra=extra)
    try:
        print("policy:\n  name: vllm_server\n  base_urls: [" + ", ".join(urls) + "]", flush=True)
        while all(p.poll() is None for p in processes):
            time.sleep(1)
        print("a replica exited; stopping the others", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop(processes)
