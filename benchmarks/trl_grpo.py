"""agentgym's GRPO trainer vs TRL's `GRPOTrainer`: time per update and peak memory.

Same tiny model (a fresh `agentgym model init`-style Qwen2 for BabyAI), same
single-turn task (one BabyAI action, rewarded by the env: GoToObj and
GoToLocal), same batch (`--tasks` prompts x `--group` samples per update),
same completion budget, temperature, learning rate, one optimizer step per
update, no KL term, the same number of updates. Free-text generation on both
sides (TRL has no action constraint). The same prompts too: TRL's dataset is
the tasks agentgym samples for each update, in order (`shuffle_dataset: false`),
and the mean prompt and completion tokens of both are printed. agentgym runs
four times: with the `hf` policy's two batching modes (static, the default, and
continuous), static with env calls on the event loop (`rollout.env_threads:
0`, as the demo runs), and static with the next update's rollout played while the
learner trains (`trainer.max_staleness: 1`: each batch is one update stale, corrected
by decoupled PPO's importance weights; TRL's GRPOTrainer here plays every batch on
the weights it trains), and `ours-whole-prompts` is the default with the learner's
shared prompts off (`trainer.share_prompts: false`); TRL runs twice:
at its fastest on a CPU (fp32, no gradient checkpointing) and with its own
defaults for those two (bf16, gradient checkpointing). Each trainer runs in its
own child process, all of them alternating, so its peak RSS is its own; the first
update of each run is left out of the time (allocator and first-call costs). An
update's time is the wall time between the ends of two updates for the
rollouts-ahead trainer (its rollout and learner overlap) and its own step time for
the others.
Phases per update: generation, env/reward and the rest (the learner; for
agentgym, generation and env steps overlap in one rollout phase). TRL is not a
dependency of agentgym: `pip install trl==1.16.0` first (it adds `datasets`,
and leaves torch and transformers as they are).

    .venv/bin/python benchmarks/trl_grpo.py --updates 8 --repeats 3
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentgym_core import hookimpl  # noqa: E402
from benchmarks.memory import peak_rss_mib, rss_mib  # noqa: E402

LEVELS = ["GoToObj", "GoToLocal"]
COMMON = {"lr": 1e-5, "max_new_tokens": 16, "temperature": 1.0, "seed": 0}


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
    from agentgym_core.run.kinds import StageContext
    from agentgym_core.run.train import TrainStage

    raw = {
        "run": {"name": "bench", "output_dir": str(out), "seed": COMMON["seed"]},
        "model": {"path": str(model)},
        "env": {"name": "babyai", "levels": LEVELS},
        "policy": {
            "name": "hf",
            "batching": "continuous" if args.child == "ours-continuous" else "static",
            **({"num_threads": 1} if args.child == "ours-gen1" else {}),
        },
        "algorithm": {"name": "grpo"},
        "scheduler": {"name": "fixed", "max_turns": args.turns},
        "rollout": {
            "max_new_tokens": COMMON["max_new_tokens"],
            "temperature": COMMON["temperature"],
            "constrained": False,
            "concurrency": args.tasks * args.group,
            **({"env_threads": 0} if args.child == "ours-inline" else {}),
        },
        "trainer": {
            "steps": args.updates,
            "tasks_per_step": args.tasks,
            "group_size": args.group,
            "lr": COMMON["lr"],
            "checkpoint_every": 0,
            "resume": False,
            **({"max_staleness": 1} if args.child == "ours-stale" else {}),
            **({"share_prompts": False} if args.child == "ours-whole-prompts" else {}),
        },
    }
    path = out / "config.yaml"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text("# benchmarks/trl_grpo.py\n" + yaml.safe_dump(raw))
    host = PluginHost()
    tokens = TokenCounter()
    host.pm.register(tokens)
    resolved = load_config(str(path), [], host.registry)
    stage = TrainStage(StageContext(resolved, host, start_model=Path(resolved.root.model.path)))
    baseline = rss_mib()
    result = stage.run(show_progress=False)
    history = result.history
    seconds = [h["step_seconds"] for h in history]
    if args.child == "ours-stale":  # overlapped phases: the wall between updates' ends
        seconds = seconds[:1] + [b - a for a, b in itertools.pairwise(tokens.update_ends)]
    return {
        "seconds": seconds,
        "phases": {
            "rollout (generation + env)": [h["rollout/seconds"] for h in history],
            "learner": [h["step_seconds"] - h["rollout/seconds"] for h in history],
        },
        "prompt_tokens": tokens.prompt,
        "completion_tokens": tokens.completion,
        "baseline_mib": baseline,
        "peak_mib": peak_rss_mib(),
    }


class TokenCounter:
    """Prompt and completion lengths of every episode agentgym plays, and when each
    update ended (a hook plugin)."""

    def __init__(self) -> None:
        self.prompt: list[int] = []
        self.completion: list[int] = []
        self.update_ends: list[float] = []

    @hookimpl
    def agentgym_after_update(self, step, metrics):  # noqa: D102
        self.update_ends.append(time.perf_counter())

    @hookimpl
    def agentgym_after_rollout(self, step, batch, metrics):  # noqa: D102
        for trajectory in batch.trajectories:
            self.prompt.append(trajectory.prompt_length)
            self.completion.append(trajectory.num_sampled_tokens)


def planned_tasks(args: argparse.Namespace) -> list[int]:
    """The tasks agentgym's trainer plays, update after update (its seeded sampling)."""
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    from agentgym_core.run.rollout_step import sample_tasks, step_seed

    train = list(BabyAIEnv(BabyAIConfig(levels=LEVELS)).tasks("train"))
    return [
        task
        for step in range(args.updates)
        for task in sample_tasks(train, args.tasks, step_seed(COMMON["seed"], step))
    ]


def run_trl(model: Path, out: Path, args: argparse.Namespace) -> dict:
    """TRL's GRPOTrainer with a reward function that plays the completion in BabyAI."""
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from agentgym_core.rollout.text import opening_messages

    env = BabyAIEnv(BabyAIConfig(levels=LEVELS))
    rows = [
        {"prompt": opening_messages(env.instruction(), env.reset(t)), "task_id": t}
        for t in planned_tasks(args)
    ]

    def env_reward(completions, task_id, episode_reward=None, **_):
        if episode_reward is not None:  # multi-turn: the rollout played the episode already
            return list(episode_reward)
        rewards = []
        for completion, task in zip(completions, task_id, strict=True):
            env.reset(task)
            rewards.append(float(env.step(completion[0]["content"].strip()).reward))
        return rewards

    times: list[float] = []
    spent = {"generation": 0.0, "env/reward": 0.0}
    phases: dict[str, list[float]] = {"generation": [], "env/reward": [], "learner": []}
    lengths: dict[str, list[int]] = {"prompt": [], "completion": []}

    class StepTimer(TrainerCallback):
        def on_step_begin(self, *a, **k):
            spent.update({"generation": 0.0, "env/reward": 0.0})
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.start)
            phases["generation"].append(spent["generation"])
            phases["env/reward"].append(spent["env/reward"])
            phases["learner"].append(times[-1] - spent["generation"] - spent["env/reward"])

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
        shuffle_dataset=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_steps=10**6,
        disable_tqdm=True,
        dataloader_num_workers=0,
        **(
            {} if args.child == "trl-defaults" else {"bf16": False, "gradient_checkpointing": False}
        ),
    )
    tokenizer = AutoTokenizer.from_pretrained(model)
    multi_turn = None
    if args.turns > 1:
        multi_turn = lockstep_rollout(tokenizer, args.turns, [row["task_id"] for row in rows])
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model),
        reward_funcs=env_reward,
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[StepTimer()],
        rollout_func=multi_turn,
    )
    generate, rewards = trainer._generate, trainer._calculate_rewards

    def timed_generate(prompts):
        start = time.perf_counter()
        out = generate(prompts)
        spent["generation"] += time.perf_counter() - start
        prompt_ids, completion_ids, sampled_mask = out[0], out[1], out[2]
        lengths["prompt"] += [len(ids) for ids in prompt_ids]
        if sampled_mask is None:
            lengths["completion"] += [len(ids) for ids in completion_ids]
        else:  # multi-turn: the model's tokens, not the observations between them
            lengths["completion"] += [sum(mask) for mask in sampled_mask]
        return out

    def timed_rewards(*a, **k):
        start = time.perf_counter()
        out = rewards(*a, **k)
        spent["env/reward"] += time.perf_counter() - start
        return out

    trainer._generate, trainer._calculate_rewards = timed_generate, timed_rewards
    baseline = rss_mib()
    trainer.train()
    if args.turns > 1:  # the rollout function plays the env too
        phases = {"rollout (lockstep generation + env)": phases["generation"], **phases}
        del phases["generation"]
    return {
        "seconds": times,
        "phases": phases,
        "prompt_tokens": lengths["prompt"],
        "completion_tokens": lengths["completion"],
        "baseline_mib": baseline,
        "peak_mib": peak_rss_mib(),
    }


def lockstep_rollout(tokenizer, turns: int, tasks: list[int]):
    """A multi-turn `rollout_func` for TRL: what a TRL user writes for an env with turns.

    TRL 1.16 has no multi-turn loop of its own for a free-text env (its
    `environment_factory` path needs a model that emits tool calls), so this plays
    AgentGym-RL's lockstep loop: every live episode of the batch generates one
    turn (`model.generate` over the whole conversation so far), then every env
    steps, until all are done or `turns` is reached. Observation tokens go in the
    completion with `env_mask` 0, as TRL's docs say.
    """
    import torch
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    from agentgym_core.rollout.chat import ChatFormat

    chat = ChatFormat(tokenizer)
    stop = set(chat.stop_ids)
    envs: list = []
    rows = iter(tasks)  # the dataset's rows in order (shuffle_dataset: false)

    def rollout(prompts, trainer):
        model = trainer.accelerator.unwrap_model(trainer.model)
        group = trainer.num_generations
        # the sampler repeats each dataset row `group` times, in dataset order
        batch = [task for task in [next(rows) for _ in prompts[::group]] for _ in range(group)]
        while len(envs) < len(prompts):
            envs.append(BabyAIEnv(BabyAIConfig(levels=LEVELS)))
        opening = []
        for env, task, prompt in zip(envs, batch, prompts, strict=True):
            observation = env.reset(task)
            if observation != prompt[-1]["content"]:
                raise RuntimeError(f"prompt order is not the dataset's (task {task})")
            opening.append(chat.prompt_ids(env.instruction(), observation))
        completion = [[] for _ in prompts]
        mask = [[] for _ in prompts]
        logprobs = [[] for _ in prompts]
        reward = [0.0 for _ in prompts]
        live = list(range(len(prompts)))
        pad = tokenizer.pad_token_id or 0
        for turn in range(turns):
            ids = [opening[i] + completion[i] for i in live]
            width = max(len(x) for x in ids)
            inputs = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
            attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])
            with torch.no_grad():
                out = model.generate(
                    inputs,
                    attention_mask=attention,
                    do_sample=True,
                    temperature=COMMON["temperature"],
                    top_k=0,
                    top_p=1.0,
                    max_new_tokens=COMMON["max_new_tokens"],
                    pad_token_id=pad,
                    output_scores=True,
                    return_dict_in_generate=True,
                )
            steps = torch.stack(out.scores, dim=1).log_softmax(-1)  # [live, new, vocab]
            still = []
            for row, i in enumerate(live):
                new = out.sequences[row, width:].tolist()
                end = next((k + 1 for k, t in enumerate(new) if t in stop), len(new))
                sampled = new[:end]
                completion[i] += sampled
                mask[i] += [1] * len(sampled)
                logprobs[i] += [float(steps[row, k, t]) for k, t in enumerate(sampled)]
                result = envs[i].step(chat.decode_action(sampled))
                reward[i] += float(result.reward)
                if result.done or turn + 1 == turns:
                    continue
                delta = chat.observation_ids(result.observation)
                completion[i] += delta
                mask[i] += [0] * len(delta)
                logprobs[i] += [0.0] * len(delta)
                still.append(i)
            live = still
            if not live:
                break
        return {
            "prompt_ids": opening,
            "completion_ids": completion,
            "logprobs": logprobs,
            "env_mask": mask,
            "episode_reward": reward,
        }

    return rollout


NAMES = {
    "ours": "agentgym (hf policy, batching: static, the default)",
    "ours-continuous": "agentgym (hf policy, batching: continuous)",
    "ours-inline": "agentgym (hf policy, batching: static, env_threads: 0)",
    "ours-stale": "agentgym (hf policy, batching: static, max_staleness: 1)",
    "ours-whole-prompts": "agentgym (hf policy, batching: static, share_prompts: false)",
    "ours-gen1": "agentgym (hf policy, batching: static, num_threads: 1)",
    "trl": "TRL GRPOTrainer, fp32, no gradient checkpointing",
    "trl-defaults": "TRL GRPOTrainer, its defaults (bf16, gradient checkpointing)",
}

RATIO_HEADS = {
    "ours": "agentgym static",
    "ours-continuous": "agentgym continuous",
    "ours-inline": "agentgym inline",
    "ours-stale": "agentgym ahead",
    "ours-whole-prompts": "agentgym whole prompts",
    "ours-gen1": "agentgym one generation thread",
}


def child(args: argparse.Namespace) -> None:
    run = run_ours if args.child.startswith("ours") else run_trl
    with tempfile.TemporaryDirectory() as tmp:
        result = run(Path(args.model), Path(tmp) / "out", args)
    print("RESULT " + json.dumps(result), flush=True)


def spawn(which: str, model: Path, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--child", which, "--model", str(model)]
    command += ["--updates", str(args.updates), "--tasks", str(args.tasks)]
    command += ["--group", str(args.group), "--turns", str(args.turns)]
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
    parser.add_argument(
        "--turns", type=int, default=1, help="> 1: BabyAI episodes of up to this many turns"
    )
    parser.add_argument(
        "--trainers", nargs="+", choices=list(NAMES), default=list(NAMES), help="default: all"
    )
    parser.add_argument("--child", choices=list(NAMES), help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        make_model(model)
        runs: dict[str, list[dict]] = {name: [] for name in args.trainers}
        for _ in range(args.repeats):
            for which in runs:  # interleaved: each repeat runs every trainer once
                runs[which].append(spawn(which, model, args))

    def median(values) -> float:
        return statistics.median(list(values))

    def mean(values) -> float:
        return statistics.mean(list(values))

    step = {k: median(s for r in v for s in r["seconds"][1:]) for k, v in runs.items()}
    peak = {k: median(r["peak_mib"] for r in v) for k, v in runs.items()}
    grow = {k: median(r["peak_mib"] - r["baseline_mib"] for r in v) for k, v in runs.items()}
    ours = [which for which in runs if which in RATIO_HEADS]
    print(
        f"{args.tasks} tasks x {args.group} samples per update, {args.updates} updates, "
        f"up to {args.turns} turns per episode\n"
    )
    print(
        "| trainer | s / update (median) | "
        + "".join(f"{RATIO_HEADS[o]} / this | " for o in ours)
        + "prompt tokens (mean) | completion tokens (mean) | peak RSS MiB | peak above start MiB |"
    )
    print("|---|---|" + "---|" * len(ours) + "---|---|---|---|")
    for which in runs:
        name = NAMES[which]
        prompt = mean(n for r in runs[which] for n in r["prompt_tokens"])
        completion = mean(n for r in runs[which] for n in r["completion_tokens"])
        ratios = "".join(f"{step[o] / step[which]:.2f}x | " for o in ours)
        print(
            f"| {name} | {step[which]:.3f} | {ratios}"
            f"{prompt:.1f} | {completion:.1f} "
            f"| {peak[which]:.0f} | {grow[which]:.0f} |"
        )
    print("\nPer update, median over updates after the first (seconds):\n")
    print("| trainer | phase | s / update |")
    print("|---|---|---|")
    for which in runs:
        name = NAMES[which]
        for phase in runs[which][0]["phases"]:
            value = median(s for r in runs[which] for s in r["phases"][phase][1:])
            print(f"| {name} | {phase} | {value:.3f} |")


if __name__ == "__main__":
    main()
