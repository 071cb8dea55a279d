"""TRL's GRPOTrainer on our BabyAI over OpenEnv, beside the same env trained here.

Both sides start from the same fresh tiny model (the demo's BabyAI levels and
size), play the same shapes (`--tasks` tasks x `--group` episodes per update,
up to `--turns` turns, 12 tokens a turn, decoding constrained to the env's
valid actions), at the same learning rate, with one optimizer step per update
and no KL term, for the same number of updates:

- **agentgym**: `agentgym train`'s GRPO stage, the env in-process (its engine:
  per-episode KV cache, env steps on threads while other episodes generate);
- **TRL**: `examples/trl_openenv.py`, GRPOTrainer with a `rollout_func` that
  plays each episode over a WebSocket session of `agentgym serve-env babyai
  --protocol openenv` (a separate process this script starts on 127.0.0.1).

Then the same agentgym evaluation of each trained model on `--eval-tasks`
held-out test tasks. Each run is a child process; the two alternate, once per
seed (the seed is the run's and the task sampling's), so a slower stretch of the
machine hits both. Seconds per update leave out each run's first update.

    .venv/bin/python benchmarks/trl_openenv.py --updates 20 --seeds 0 1 2
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

import httpx

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.harness.stats import half_width  # noqa: E402

LEVELS = ["GoToObj", "GoToLocal", "PickupDist", "OpenDoor", "PutNextLocalS5N3"]
ENV = {"name": "babyai", "levels": LEVELS, "list_actions": False}
LR, MAX_NEW_TOKENS = 1e-3, 12


def make_model(folder: Path) -> None:
    """The demo's from-scratch model: a tokenizer trained on BabyAI's text, vocab 512."""
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model

    env = BabyAIEnv(BabyAIConfig(levels=LEVELS, list_actions=False))
    try:
        texts = env_corpus(env, list(env.tasks("train"))[:300], max_turns=6, seed=0)
    finally:
        env.close()
    init_model(texts, folder, TinyModelConfig(vocab_size=512, seed=0))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server() -> tuple[subprocess.Popen, str]:
    """`agentgym serve-env babyai --protocol openenv` on a free loopback port, once healthy."""
    port = free_port()
    agentgym = Path(sys.executable).parent / "agentgym"
    command = [str(agentgym), "serve-env", "babyai", "--protocol", "openenv"]
    command += ["--port", str(port), "--max-sessions", "512", "--log-level", "warning"]
    command += ["-o", f"levels=[{','.join(LEVELS)}]", "-o", "list_actions=false"]
    server = subprocess.Popen(command)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return server, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.kill()
    raise SystemExit("the OpenEnv server did not become healthy in 60 s")


def config(model: Path, out: Path, args: argparse.Namespace, seed: int) -> dict:
    """The agentgym side's config; its eval block is the evaluation both sides get."""
    return {
        "run": {"name": "trl-openenv-bench", "output_dir": str(out), "seed": seed},
        "model": {"path": str(model)},
        "env": ENV,
        "policy": {"name": "hf", "max_batch_size": 128},
        "algorithm": {"name": "grpo", "kl_coef": 0.0},
        "scheduler": {"name": "fixed", "max_turns": args.turns},
        "rollout": {"max_new_tokens": MAX_NEW_TOKENS, "concurrency": args.tasks * args.group},
        "trainer": {
            "steps": args.updates,
            "tasks_per_step": args.tasks,
            "group_size": args.group,
            "lr": LR,
            "warmup_steps": 0,
            "checkpoint_every": args.updates,
            "resume": False,
        },
        "eval": {"split": "test", "num_tasks": args.eval_tasks, "max_turns": args.turns},
        "tracking": {"traces": False},
    }


def load(raw: dict, out: Path, stages: list[dict]):
    """A resolved config from `raw` with these stages, and its plugin host."""
    import yaml

    from agentgym_core.config.load import load_config
    from agentgym_core.plugins import PluginHost

    out.mkdir(parents=True, exist_ok=True)
    path = out / "config.yaml"
    path.write_text("# benchmarks/trl_openenv.py\n" + yaml.safe_dump({**raw, "stages": stages}))
    host = PluginHost()
    return load_config(str(path), [], host.registry), host


def held_out(trained: Path, raw: dict, out: Path) -> float:
    """agentgym's evaluation of `trained` on the held-out test tasks: the success rate."""
    from agentgym_core.run.pipeline import run_pipeline

    raw = {**raw, "model": {"path": str(trained)}}
    resolved, host = load(raw, out, [{"name": "after", "type": "eval"}])
    (result,) = run_pipeline(resolved, host, show_progress=False, quiet=True)
    return float(result.metrics["success_rate"])


def run_ours(model: Path, out: Path, args: argparse.Namespace, seed: int) -> dict:
    """`agentgym train`'s stage, then the evaluation."""
    from agentgym_core.run.kinds import StageContext
    from agentgym_core.run.train import TrainStage

    raw = config(model, out / "train", args, seed)
    resolved, host = load(raw, out / "train", [{"name": "train", "type": "train"}])
    stage = TrainStage(StageContext(resolved, host, start_model=model))
    result = stage.run(show_progress=False)
    seconds = [h["step_seconds"] for h in result.history]
    trained = out / "train" / "checkpoints" / f"step-{args.updates:06d}"
    success = [h["rollout/success_rate"] for h in result.history]
    return {
        "seconds": seconds,
        "train_success": success,
        "held_out": held_out(trained, raw, out / "eval"),
    }


def run_trl(model: Path, out: Path, args: argparse.Namespace, seed: int) -> dict:
    """examples/trl_openenv.py's `train` against the server, then the same evaluation."""
    import importlib.util

    from transformers import TrainerCallback

    example_file = ROOT / "examples" / "trl_openenv.py"
    spec = importlib.util.spec_from_file_location("trl_openenv", example_file)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    times: list[float] = []
    rewards: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.start)

        def on_log(self, args, state, control, logs=None, **k):
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))

    example.train(
        args.url,
        model,
        out / "trained",
        updates=args.updates,
        tasks_per_update=args.tasks,
        group_size=args.group,
        max_turns=args.turns,
        max_new_tokens=MAX_NEW_TOKENS,
        lr=LR,
        seed=seed,
        callbacks=[Timer()],
    )
    raw = config(model, out / "eval", args, seed)
    return {
        "seconds": times,
        "train_reward": rewards,
        "held_out": held_out(out / "trained", raw, out / "eval"),
    }


NAMES = {
    "ours": "agentgym (env in-process)",
    "trl": "TRL GRPOTrainer (env over OpenEnv, examples/trl_openenv.py)",
}


def spawn(which: str, model: Path, args: argparse.Namespace, seed: int) -> dict:
    """One run in a child process; its result is the last RESULT line it prints."""
    command = [sys.executable, __file__, "--child", which, "--model", str(model)]
    command += ["--seed", str(seed), "--url", args.url or ""]
    for flag in ("updates", "tasks", "group", "turns", "eval_tasks"):
        command += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{which} (seed {seed}) failed:\n{done.stderr[-4000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def interval(values: list[float]) -> str:
    """Mean and a 95% interval over seeds (t, n-1 degrees of freedom)."""
    mean = statistics.mean(values)
    if len(values) < 2:
        return f"{mean:.3f}"
    return f"{mean:.3f} ± {half_width(values):.3f}"


def report(runs: dict[str, list[dict]], untrained: float, args: argparse.Namespace) -> None:
    """The table, per-seed values beside it."""
    step = {k: statistics.median(s for r in v for s in r["seconds"][1:]) for k, v in runs.items()}
    print(
        f"\n{args.tasks} tasks x {args.group} episodes per update, up to {args.turns} turns, "
        f"{args.updates} updates, seeds {args.seeds}; held out: {args.eval_tasks} test tasks "
        f"(untrained model: {untrained:.3f})\n"
    )
    print(
        "| trainer | s / update (median) | agentgym / this | held-out success, mean ± 95% "
        "| per seed |"
    )
    print("|---|---|---|---|---|")
    for which, results in runs.items():
        per_seed = ", ".join(f"{r['held_out']:.3f}" for r in results)
        print(
            f"| {NAMES[which]} | {step[which]:.2f} | {step['ours'] / step[which]:.2f}x "
            f"| {interval([r['held_out'] for r in results])} | {per_seed} |"
        )


def main() -> None:
    """Parent: server, model, interleaved children, table. Child: one run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--eval-tasks", type=int, default=200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--child", choices=list(NAMES), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        run = run_ours if args.child == "ours" else run_trl
        with tempfile.TemporaryDirectory() as tmp:
            result = run(Path(args.model), Path(tmp), args, args.seed)
        print("RESULT " + json.dumps(result), flush=True)
        return
    server, args.url = start_server()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model = Path(tmp) / "model"
            make_model(model)
            untrained = held_out(model, config(model, Path(tmp), args, 0), Path(tmp) / "eval0")
            runs: dict[str, list[dict]] = {name: [] for name in NAMES}
            for seed in args.seeds:
                for which in runs:  # interleaved: each seed runs both
                    runs[which].append(spawn(which, model, args, seed))
                    print(which, seed, json.dumps(runs[which][-1]), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    report(runs, untrained, args)


if __name__ == "__main__":
    main()
