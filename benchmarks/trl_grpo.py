"""agentgym's GRPO trainer vs TRL's `GRPOTrainer`: time per update and peak memory.

Same tiny model (a fresh `agentgym model init`-style Qwen2 for BabyAI), same
single-turn task (one BabyAI action, rewarded by the env: GoToObj and
GoToLocal), same batch (`--tasks` prompts x `--group` samples per update),
same completion budget, temperature, learning rate, one optimizer step per
update, no KL term, the same number of updates. Free-text generation on both
sides (TRL has no action constraint). Each trainer runs in its own child
process, alternating, so its peak RSS is its own; the first update of each run
is left out of the time (allocator and first-call costs). TRL is not a
dependency of agentgym: `pip install trl==1.16.0` first (it adds `datasets`,
and leaves torch and transformers as they are).

    .venv/bin/python benchmarks/trl_grpo.py --updates 8 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LEVELS = ["GoToObj", "GoToLocal"]
COMMON = {"lr": 1e-5, "max_new_tokens": 16, "temperature": 1.0, "seed": 0}


def rss_mib() -> float:
    """Resident memory of this process now."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def peak_rss_mib() -> float:
    """Peak resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def make_model(folder: Path) -> None:
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model

    env = BabyAIEnv(BabyAIConfig(levels=LEVELS))
    init_model(env_corpus(env, env.tasks("train")[:200], max_turns=4), folder, TinyModelConfig())


def run_ours(model: Path, out: Path, args: argparse.Namespace) -> dict:
    """The `agentgym train` stage on a config written for this run; step times from its history."""
    import yaml

    from agentgym_core.config.load import load_config
    from agentgym_core.plugins import PluginHost
    from agentgym_core.run.train import TrainStage

    raw = {
        "run": {"name": "bench", "output_dir": str(out), "seed": COMMON["seed"]},
        "model": {"path": str(model)},
        "env": {"name": "babyai", "levels": LEVELS},
        "algorithm": {"name": "grpo"},
        "scheduler": {"name": "fixed", "max_turns": 1},
        "rollout": {
            "max_new_tokens": COMMON["max_new_tokens"],
            "temperature": COMMON["temperature"],
            "constrained": False,
            "concurrency": args.tasks * args.group,
        },
        "trainer": {
            "steps": args.updates,
            "tasks_per_step": args.tasks,
            "group_size": args.group,
            "lr": COMMON["lr"],
            "checkpoint_every": 0,
            "resume": False,
        },
    }
    path = out / "config.yaml"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text("# benchmarks/trl_grpo.py\n" + yaml.safe_dump(raw))
    host = PluginHost()
    stage = TrainStage(load_config(str(path), [], host.registry), host)
    baseline = rss_mib()
    result = stage.run(show_progress=False)
    return {
        "seconds": [h["step_seconds"] for h in result.history],
        "baseline_mib": baseline,
        "peak_mib": peak_rss_mib(),
    }


def run_trl(model: Path, out: Path, args: argparse.Namespace) -> dict:
    """TRL's GRPOTrainer with a reward function that plays the completion in BabyAI."""
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agentgym_core.rollout.text import opening_messages

    env = BabyAIEnv(BabyAIConfig(levels=LEVELS))
    tasks = list(env.tasks("train"))[: args.tasks * args.updates]
    rows = [
        {"prompt": opening_messages(env.instruction(), env.reset(t)), "task_id": t} for t in tasks
    ]

    def env_reward(completions, task_id, **_):
        rewards = []
        for completion, task in zip(completions, task_id, strict=True):
            env.reset(task)
            rewards.append(float(env.step(completion[0]["content"].strip()).reward))
        return rewards

    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.start)

    config = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=args.tasks * args.group,
        num_generations=args.group,
        steps_per_generation=1,
        gradient_accumulation_steps=1,
        num_iterations=1,
        beta=0.0,
        max_completion_length=COMMON["max_new_tokens"],
        temperature=COMMON["temperature"],
        learning_rate=COMMON["lr"],
        max_steps=args.updates,
        seed=COMMON["seed"],
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=10**6,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model),
        reward_funcs=env_reward,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=AutoTokenizer.from_pretrained(model),
        callbacks=[StepTimer()],
    )
    baseline = rss_mib()
    trainer.train()
    return {"seconds": times, "baseline_mib": baseline, "peak_mib": peak_rss_mib()}


def child(args: argparse.Namespace) -> None:
    run = run_ours if args.child == "ours" else run_trl
    with tempfile.TemporaryDirectory() as tmp:
        result = run(Path(args.model), Path(tmp) / "out", args)
    print("RESULT " + json.dumps(result), flush=True)


def spawn(which: str, model: Path, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--child", which, "--model", str(model)]
    command += ["--updates", str(args.updates), "--tasks", str(args.tasks)]
    command += ["--group", str(args.group)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        raise SystemExit(f"{which} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--updates", type=int, default=8)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=["ours", "trl"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        make_model(model)
        runs: dict[str, list[dict]] = {"ours": [], "trl": []}
        for _ in range(args.repeats):
            for which in runs:
                runs[which].append(spawn(which, model, args))

    def median(values) -> float:
        return statistics.median(list(values))

    step = {k: median(s for r in v for s in r["seconds"][1:]) for k, v in runs.items()}
    peak = {k: median(r["peak_mib"] for r in v) for k, v in runs.items()}
    grow = {k: median(r["peak_mib"] - r["baseline_mib"] for r in v) for k, v in runs.items()}
    print(f"{args.tasks} tasks x {args.group} samples per update, {args.updates} updates\n")
    print("| trainer | s / update (median) | peak RSS MiB | peak above start MiB |")
    print("|---|---|---|---|")
    for which, name in (("ours", "agentgym"), ("trl", "TRL GRPOTrainer")):
        print(f"| {name} | {step[which]:.3f} | {peak[which]:.0f} | {grow[which]:.0f} |")
    print(
        f"| agentgym / TRL | {step['ours'] / step['trl']:.2f}x | {peak['ours'] / peak['trl']:.2f}x "
        f"| {grow['ours'] / grow['trl']:.2f}x |"
    )


if __name__ == "__main__":
    main()
