"""Static batching with and without `gather_ms`: one single-turn rollout of 64 episodes.

The 64 episodes of a single-turn update (8 BabyAI tasks x 8 samples, the shapes of
`benchmarks/trl_grpo.py`) reset in env threads and send their requests a few ms
apart. Prints, per setting, the batches the policy formed, the median rollout time
and the median time an episode waited for its generation (about one prefill +
decode when everything runs as one batch). Interleaved, after one warm-up each.

    .venv/bin/python benchmarks/gather.py --repeats 6
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--gather-ms", type=float, nargs="+", default=[0.0, 5.0])
    args = parser.parse_args()

    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model
    from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig
    from agentgym_core.rollout.chat import ChatFormat
    from agentgym_core.rollout.engine import EpisodeSpec, RolloutEngine, RolloutSettings

    levels = ["GoToObj", "GoToLocal"]
    env = BabyAIEnv(BabyAIConfig(levels=levels))
    folder = Path(tempfile.mkdtemp())
    init_model(env_corpus(env, env.tasks("train")[:200], max_turns=4), folder, TinyModelConfig())
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tasks = env.tasks("train")[:8]
    episodes = [EpisodeSpec(t, group=i, sample=s) for i, t in enumerate(tasks) for s in range(8)]
    settings = RolloutSettings(max_turns=1, max_new_tokens=16, constrained=False, concurrency=64)
    engines = {}
    for gather in args.gather_ms:
        policy = HFPolicy(
            HFPolicyConfig(max_batch_size=64, gather_ms=gather), model=model, tokenizer=tokenizer
        )
        chat = ChatFormat(tokenizer, model.generation_config)
        engines[gather] = RolloutEngine(
            lambda: BabyAIEnv(BabyAIConfig(levels=levels)), policy, chat
        )
        engines[gather].run(episodes, settings)  # warm-up
    seconds = {g: [] for g in engines}
    waits = {g: [] for g in engines}
    batches = {g: [] for g in engines}
    for _ in range(args.repeats):
        for gather, engine in engines.items():
            engine.policy.batch_sizes.clear()
            engine.generate_seconds = 0.0
            start = time.perf_counter()
            engine.run(episodes, settings)
            seconds[gather].append(time.perf_counter() - start)
            waits[gather].append(engine.generate_seconds / len(episodes))
            batches[gather].append(list(engine.policy.batch_sizes))
    print("| gather_ms | batches per rollout | rollout s (median) | generation wait s (median) |")
    print("|---|---|---|---|")
    for gather in engines:
        shown = " ".join(str(b) for b in batches[gather])
        print(
            f"| {gather:g} | {shown} | {statistics.median(seconds[gather]):.3f} "
            f"| {statistics.median(waits[gather]):.3f} |"
        )


if __name__ == "__main__":
    main()
