"""In-process `vllm` against `vllm_server` on one and two replicas: seconds per update, syncs.

The demo's BabyAI levels and batch shape (16 tasks x 8 episodes per update),
fixed 6 turns, GRPO, on a fresh tiny model vLLM's CPU kernels take (head size
32). Each arm trains `--updates` updates in its own child process; the arms
alternate, `--repeats` times. The replicas are started (`agentgym
serve-policy`'s launcher) before the clock runs. Reported: the median seconds
per update (each run's first left out) and the median seconds of a weight
sync (write + reload on every replica, or vLLM's in-process reload). Run in
the vLLM venv:

    .venv-vllm/bin/python benchmarks/vllm_servers.py --updates 6 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LEVELS = ["GoToObj", "GoToLocal", "PickupDist", "OpenDoor", "PutNextLocalS5N3"]
CPU_FLAGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "2048"]
CPU_FLAGS += ["--kv-cache-memory-bytes", str(512 * 2**20)]
ARMS = {"vllm": "vllm, in the learner's process", "server1": "vllm_server, 1 replica"}
ARMS["server2"] = "vllm_server, 2 replicas"


def make_model(folder: Path) -> None:
    """A from-scratch model on the demo's levels with 2 heads of 32 (vLLM-CPU's minimum)."""
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model

    env = BabyAIEnv(BabyAIConfig(levels=LEVELS, list_actions=False))
    try:
        texts = env_corpus(env, list(env.tasks("train"))[:300], max_turns=6, seed=0)
    finally:
        env.close()
    size = TinyModelConfig(vocab_size=512, num_heads=2, num_kv_heads=1, seed=0)
    init_model(texts, folder, size)


def free_ports(count: int) -> int:
    """A first port of `count` consecutive free ones."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        try:
            for offset in range(1, count):
                with socket.socket() as other:
                    other.bind(("127.0.0.1", first + offset))
        except OSError:
            continue
        return first
    raise RuntimeError("no consecutive free ports")


def run_arm(arm: str, model: Path, updates: int) -> dict:
    """Train `updates` updates with the arm's policy; step and sync seconds."""
    import yaml
    from agentgym_policy_vllm.launch import start_replicas, stop
    from agentgym_policy_vllm.policy import VLLMPolicy
    from agentgym_policy_vllm.server import VLLMServerPolicy

    from agentgym_core.config.load import load_config
    from agentgym_core.plugins import PluginHost
    from agentgym_core.run.kinds import StageContext
    from agentgym_core.run.train import TrainStage

    syncs: list[float] = []
    for cls in (VLLMPolicy, VLLMServerPolicy):
        original = cls.sync_weights

        def timed(self, weights, original=original):
            start = time.perf_counter()
            original(self, weights)
            syncs.append(time.perf_counter() - start)

        cls.sync_weights = timed
    processes: list = []
    if arm == "vllm":
        policy = {"name": "vllm", "kv_cache_gib": 0.5, "enforce_eager": True}
    else:
        replicas = int(arm.removeprefix("server"))
        processes, urls = start_replicas(
            str(model), replicas, free_ports(replicas), extra=CPU_FLAGS, log=subprocess.DEVNULL
        )
        policy = {"name": "vllm_server", "base_urls": urls}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            raw = {
                "run": {"name": "vllm-servers", "output_dir": tmp, "seed": 0},
                "model": {"path": str(model)},
                "env": {"name": "babyai", "levels": LEVELS, "list_actions": False},
                "policy": policy,
                "algorithm": {"name": "grpo", "kl_coef": 0.0},
                "scheduler": {"name": "fixed", "max_turns": 6},
                "rollout": {"max_context_tokens": 1024, "max_new_tokens": 12},
                "trainer": {"steps": updates, "tasks_per_step": 16, "group_size": 8},
                "tracking": {"traces": False},
            }
            path = Path(tmp) / "config.yaml"
            path.write_text(yaml.safe_dump(raw))
            host = PluginHost()
            resolved = load_config(str(path), [], host.registry)
            stage = TrainStage(StageContext(resolved, host, start_model=model))
            history = stage.run(show_progress=False).history
    finally:
        stop(processes)
    return {
        "seconds": [h["step_seconds"] for h in history],
        "syncs": syncs,
        "success": [h["rollout/success_rate"] for h in history],
    }


def main() -> None:
    """Parent: model, interleaved children, table. Child: one arm."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--child", choices=list(ARMS), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = run_arm(args.child, Path(args.model), args.updates)
        print("RESULT " + json.dumps(result), flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        make_model(model)
        runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
        for _ in range(args.repeats):
            for arm in ARMS:  # interleaved
                command = [sys.executable, __file__, "--child", arm, "--model", str(model)]
                command += ["--updates", str(args.updates)]
                done = subprocess.run(command, capture_output=True, text=True, check=False)
                lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
                if done.returncode or not lines:
                    raise SystemExit(f"{arm} failed:\n{done.stderr[-4000:]}")
                runs[arm].append(json.loads(lines[-1].removeprefix("RESULT ")))
                print(arm, json.dumps(runs[arm][-1]), flush=True)
    step = {a: statistics.median(s for r in v for s in r["seconds"][1:]) for a, v in runs.items()}
    sync = {a: statistics.median(s for r in v for s in r["syncs"]) for a, v in runs.items()}
    print(f"\n16 tasks x 8 episodes per update, 6 turns, {args.updates} updates x {args.repeats}\n")
    print("| generation | s / update (median) | / in-process | weight sync s (median) |")
    print("|---|---|---|---|")
    for arm, name in ARMS.items():
        print(f"| {name} | {step[arm]:.2f} | {step[arm] / step['vllm']:.2f}x | {sync[arm]:.3f} |")


if __name__ == "__main__":
    main()
