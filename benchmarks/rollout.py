"""Async rollout engine vs the lockstep loop (generate for all live episodes, then step all).

Same tiny model, same BabyAI tasks, same per-request seeds (so both loops play
exactly the same tokens), with an injected environment latency per step.
Reports episodes/s of both, their ratio, and the async wall time divided by
max(generation-only time, environment-only time): 1.0 would be perfect overlap.
No schedule finishes before the larger of those two, so lockstep wall over it
(the last column) is the most any async engine could gain over lockstep here.

    .venv/bin/python benchmarks/rollout.py --episodes 64 --turns 5 --latency-ms 0 20 100

`--batching static continuous` (the default) times the `hf` policy's two batching
modes in the same repeats, interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
from agentgym_env_babyai import BabyAIConfig, BabyAIEnv
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentgym_core.interfaces import SamplingParams
from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model
from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.rollout.engine import EpisodeSpec, RolloutEngine, RolloutSettings

LEVELS = ["GoToLocal", "PickupDist", "OpenDoor"]


class SlowEnv(BabyAIEnv):
    """BabyAI with a latency on every step, like a remote env server.

    `jitter="exp"` draws each step's latency from an exponential distribution
    with mean `latency`, seeded by (task, step), so both loops wait the same.
    """

    latency = 0.0
    jitter = "none"

    def reset(self, task_id):  # noqa: D102
        self._delays = random.Random(task_id)
        return super().reset(task_id)

    def step(self, action):  # noqa: D102
        factor = self._delays.expovariate(1.0) if self.jitter == "exp" else 1.0
        time.sleep(self.latency * factor)
        return super().step(action)


def seed_of(settings: RolloutSettings, spec: EpisodeSpec, turn: int) -> int:
    """The engine's per-request seed, so lockstep samples the same tokens."""
    return hash((settings.seed, spec.task_id, spec.group, spec.sample, turn)) % (2**62)


async def lockstep(policy, chat, make_env, episodes, settings, pool) -> float:
    """AgentGym-RL's loop: a barrier after generation and after the env steps of every turn."""
    loop = asyncio.get_running_loop()
    envs = [make_env() for _ in episodes]
    start = time.perf_counter()
    firsts = await asyncio.gather(
        *(
            loop.run_in_executor(pool, env.reset, spec.task_id)
            for env, spec in zip(envs, episodes, strict=True)
        )
    )
    ids = [chat.prompt_ids(env.instruction(), obs) for env, obs in zip(envs, firsts, strict=True)]
    live = list(range(len(episodes)))
    for turn in range(settings.max_turns):
        gens = await asyncio.gather(
            *(
                policy.generate(
                    ids[i],
                    SamplingParams(
                        settings.max_new_tokens,
                        settings.temperature,
                        seed=seed_of(settings, episodes[i], turn),
                    ),
                    envs[i].valid_actions(),
                    session=("lockstep", i),  # same KV reuse as the engine: only scheduling differs
                )
                for i in live
            )
        )
        results = await asyncio.gather(
            *(
                loop.run_in_executor(pool, envs[i].step, g.text)
                for i, g in zip(live, gens, strict=True)
            )
        )
        still = []
        for i, gen, result in zip(live, gens, results, strict=True):
            ids[i] += gen.token_ids
            if not result.done and turn + 1 < settings.max_turns:
                ids[i] += chat.observation_ids(result.observation)
                still.append(i)
        live = still
        if not live:
            break
    elapsed = time.perf_counter() - start
    for i in range(len(episodes)):
        policy.release(("lockstep", i))
    return elapsed


def env_only(make_env, trajectories, pool) -> float:
    """Replay the recorded actions without a model: the environment's share alone."""

    async def replay() -> None:
        loop = asyncio.get_running_loop()

        async def one(traj):
            env = make_env()
            await loop.run_in_executor(pool, env.reset, traj.task_id)
            for turn in traj.turns:
                await loop.run_in_executor(pool, env.step, turn.action)

        await asyncio.gather(*(one(t) for t in trajectories))

    start = time.perf_counter()
    asyncio.run(replay())
    return time.perf_counter() - start


def main() -> None:
    """Run the comparison and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0, 20, 100])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--jitter", choices=["none", "exp"], default="none")
    parser.add_argument(
        "--batching",
        nargs="+",
        choices=["static", "continuous"],
        default=["static", "continuous"],
        help="the hf policy's batching modes, run interleaved (lockstep always uses static)",
    )
    args = parser.parse_args()

    config = BabyAIConfig(levels=LEVELS, list_actions=False)
    with tempfile.TemporaryDirectory() as tmp:
        corpus_env = BabyAIEnv(config)
        texts = env_corpus(corpus_env, corpus_env.tasks("train")[:200], max_turns=5)
        init_model(texts, Path(tmp), TinyModelConfig(vocab_size=512))
        model = AutoModelForCausalLM.from_pretrained(tmp)
        tokenizer = AutoTokenizer.from_pretrained(tmp)
    torch.manual_seed(0)
    policies = {
        mode: HFPolicy(
            HFPolicyConfig(max_batch_size=args.episodes, batching=mode),
            model=model,
            tokenizer=tokenizer,
        )
        for mode in dict.fromkeys(["static", *args.batching])
    }
    chat = ChatFormat(tokenizer, model.generation_config)
    tasks = BabyAIEnv(config).tasks("test")[: args.episodes]
    episodes = [EpisodeSpec(task, group=i) for i, task in enumerate(tasks)]
    settings = RolloutSettings(
        max_turns=args.turns, seed=1, concurrency=args.episodes, max_context_tokens=2048
    )
    pool = concurrent.futures.ThreadPoolExecutor(args.episodes)

    SlowEnv.jitter = args.jitter

    def make_env():
        return SlowEnv(config)

    print(
        "| env latency | batching | async episodes/s | lockstep episodes/s | async / lockstep | "
        "async wall / max(gen-only, env-only) | gen-only s | env-only s | "
        "lockstep / max(gen-only, env-only) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")

    def timed_run(policy: HFPolicy) -> tuple[float, list]:
        engine = RolloutEngine(make_env, policy, chat, env_threads=args.episodes)
        start = time.perf_counter()
        trajectories = engine.run(episodes, settings)
        seconds = time.perf_counter() - start
        engine.close()
        return seconds, trajectories

    for latency_ms in args.latency_ms:
        async_times = {mode: [] for mode in args.batching}
        gen_times = {mode: [] for mode in args.batching}
        lock_times, env_times = [], []
        for _ in range(args.repeats):  # every contender once per repeat, interleaved
            SlowEnv.latency = latency_ms / 1000
            for mode in args.batching:
                seconds, trajectories = timed_run(policies[mode])
                async_times[mode].append(seconds)
            lock_times.append(
                asyncio.run(lockstep(policies["static"], chat, make_env, episodes, settings, pool))
            )
            env_times.append(env_only(make_env, trajectories, pool))
            SlowEnv.latency = 0.0
            for mode in args.batching:
                gen_times[mode].append(timed_run(policies[mode])[0])
        lk, n = statistics.median(lock_times), len(episodes)
        for mode in args.batching:
            a = statistics.median(async_times[mode])
            gen, env = statistics.median(gen_times[mode]), statistics.median(env_times)
            bound = max(gen, env)  # no schedule beats the larger part
            cells = [f"{latency_ms:.0f} ms", mode, f"{n / a:.1f}", f"{n / lk:.1f}"]
            cells += [f"{lk / a:.2f}x", f"{a / bound:.2f}"]
            # the last column: the best async / lockstep any schedule could reach here
            cells += [f"{gen:.2f}", f"{env:.2f}", f"{lk / bound:.2f}x"]
            print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
