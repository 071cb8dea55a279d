"""The `hf` policy's prefill + decode against `model.generate`, on the same batch.

The single-turn shapes of `benchmarks/trl_grpo.py`: 64 BabyAI prompts (8 tasks x 8
samples, the chat template's real text, left-padded), 16 sampled tokens each at
temperature 1, no stop token on either side, so both run 1 prefill and 15 decode
steps on the same model. Contenders, interleaved after one warm-up each:

- `hf` static batch, no KV kept (`prefix_cache: false`);
- `hf` static batch that keeps each row's KV for the next turn (the default);
- `model.generate(do_sample=True, top_k=0)`: what TRL's GRPOTrainer calls.

Prints the median seconds of each and its ratio to `model.generate`.

    .venv/bin/python benchmarks/decode.py --repeats 7
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import tempfile
import time
from pathlib import Path

LEVELS = ["GoToObj", "GoToLocal"]
NEW_TOKENS = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    import torch
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym_core.interfaces import SamplingParams
    from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model
    from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig
    from agentgym_core.policies.sampling import Request

    env = BabyAIEnv(BabyAIConfig(levels=LEVELS))
    folder = Path(tempfile.mkdtemp())
    init_model(env_corpus(env, env.tasks("train")[:200], max_turns=4), folder, TinyModelConfig())
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)

    policies = {
        keep: HFPolicy(
            HFPolicyConfig(max_batch_size=64, prefix_cache=keep), model=model, tokenizer=tokenizer
        )
        for keep in (False, True)
    }
    chat = policies[False].chat
    for policy in policies.values():
        policy.chat.stop_ids = set()  # exactly NEW_TOKENS each, as generate below
    prompts = []
    for task in env.tasks("train")[:8]:
        prompt = chat.prompt_ids(env.instruction(), env.reset(task))
        prompts += [prompt] * 8
    width = max(len(p) for p in prompts)
    pad = policies[False].pad_id
    padded = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    config = copy.deepcopy(model.generation_config)
    config.update(
        eos_token_id=None,
        pad_token_id=pad,
        do_sample=True,
        top_k=0,
        top_p=1.0,
        temperature=1.0,
        max_new_tokens=NEW_TOKENS,
    )
    loop = asyncio.new_event_loop()

    def ours(keep: bool) -> None:
        policy = policies[keep]
        policy.cache.clear()
        batch = [
            Request(
                list(p),
                SamplingParams(max_new_tokens=NEW_TOKENS, seed=row),
                None,
                loop.create_future(),
                session=row if keep else None,
            )
            for row, p in enumerate(prompts)
        ]
        policy._generate_batch(batch)
        assert all(len(r.tokens) == NEW_TOKENS for r in batch)

    def theirs() -> None:
        with torch.no_grad():
            out = model.generate(padded, attention_mask=mask, generation_config=config)
        assert out.shape[1] == width + NEW_TOKENS

    contenders = {
        "hf static, no KV kept": lambda: ours(False),
        "hf static, KV kept per row (default)": lambda: ours(True),
        "model.generate": theirs,
    }
    seconds: dict[str, list[float]] = {name: [] for name in contenders}
    for run in contenders.values():
        run()  # warm-up
    for _ in range(args.repeats):
        for name, run in contenders.items():
            start = time.perf_counter()
            run()
            seconds[name].append(time.perf_counter() - start)
    tokens = sum(len(p) for p in prompts) / len(prompts)
    print(f"64 prompts, {tokens:.1f} tokens on average (padded to {width}), {NEW_TOKENS} new each")
    base = statistics.median(seconds["model.generate"])
    print("| contender | s (median) | / model.generate | runs |")
    print("|---|---|---|---|")
    for name, values in seconds.items():
        median = statistics.median(values)
        shown = " ".join(f"{v:.3f}" for v in values)
        print(f"| {name} | {median:.3f} | {median / base:.2f}x | {shown} |")


if __name__ == "__main__":
    main()
