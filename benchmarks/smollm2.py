"""The real SmolLM2-135M-Instruct on 2 CPU cores: an update's tokens/s, generation's tokens/s.

Updates (`--update`, in the project's venv): one learner update after another on
the same batch of 16 trajectories of 384 tokens (a third prompt, then 40% agent
tokens), each arm in a fresh process, arms interleaved per repeat (the
machinery of `benchmarks/lora.py --memory`). Arms: `full` (float32), `full:bf16`
(bfloat16 weights, float32 master copies), `lora` (rank 16 on a float32 base),
`lora:bf16` (on a bfloat16 base), `lora-top15:bf16` (adapters on the last 15 of
30 layers, `model.lora.top_layers`: the backward pass stops under them), and
`full:all-logits`, the float32 update with the output layer run on every
position instead of only where the loss needs it (what the learner did before
it kept logits to agent tokens).

    .venv/bin/python benchmarks/smollm2.py --update --repeats 3

Generation (`--generate`, in the vLLM venv, which has both policies): the same
16 free-text BabyAI episodes (AgentGym's levels, the action list every turn,
`--turns` turns, 16 tokens a turn, temperature 1, seeded), played through the
same `RolloutEngine`, arms interleaved per repeat. Arms: `hf-before` (the `hf`
policy as it was: transformers' `sdpa` and a cache grown by concatenation),
`hf` (now: `sdpa_gqa`, a cache with room made once per turn), `hf:bf16`,
`vllm` (the in-process vLLM engine, float32) and `vllm:bf16`.

    .venv-vllm/bin/python benchmarks/smollm2.py --generate --repeats 2 --turns 6

One prefill (`--prefill`): a first turn's forward pass over 16 prompts of 557
tokens, float32 and bfloat16, transformers' `sdpa` and agentgym's `sdpa_gqa`.

    .venv/bin/python benchmarks/smollm2.py --prefill --repeats 3

Long turns (`--long-turns`): the `hf` policy on SmolLM2 in bfloat16, loaded as
a run loads it, on 32 sessions (`--sessions`) whose first prompts are 2,000
random tokens (`--context`), then turns of 100 new tokens each and 16 sampled;
per turn its time by part (the policy's timers, static batching only) and peak
resident memory. Arms: the policy's `kv_cache_dtype`, `model` (the cache in
bfloat16) and `auto` (float32 where the CPU emulates bfloat16, else the same as
`model`), optionally with its `batching` (`auto:continuous`), each in a fresh
process, interleaved per repeat.

    .venv/bin/python benchmarks/smollm2.py --long-turns --turns 3 --repeats 2

Prefill groups (`--split-prefill`): AgentGym's first `--tasks` BabyAI test
tasks, constrained (`--free`: free text, up to 32 tokens a turn), 20 turns, 24
in flight, SmolLM2 in bfloat16 loaded as a run loads it; arms: the `hf`
policy's `split_prefill_tokens` (`0`: one group, every row padded to the longest
uncached tail; `auto`; a number), each in a fresh process, interleaved per
repeat; `ARM@COMMIT` runs that commit's code.

    .venv/bin/python benchmarks/smollm2.py --split-prefill --repeats 1

The sampler against the learner in bfloat16 (`--sampler-gap`): 16 free-text
BabyAI episodes through `hf` with each `kv_cache_dtype`, then scored as an
update scores them; the mean and largest |difference| of the sampled tokens'
log-probs.

    .venv/bin/python benchmarks/smollm2.py --sampler-gap --turns 3

All take the model from `agentgym model fetch smollm2-135m-instruct` (the cache).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CODE = "SMOLLM2_BENCHMARK_CODE"
"""Set by `interleaved` for an `ARM@COMMIT` arm: a worktree whose `agentgym_core` is imported."""
sys.path.insert(0, str(ROOT))
if os.environ.get(CODE):
    sys.path.insert(0, os.environ[CODE])

from benchmarks.memory import peak_rss_mib  # noqa: E402

UPDATE_ARMS = ["full", "full:bf16", "lora", "lora:bf16", "lora-top15:bf16", "full:all-logits"]
GENERATE_ARMS = ["hf-before", "hf", "hf:bf16", "vllm", "vllm:bf16"]
LONG_TURN_ARMS = ["model", "auto"]
SPLIT_ARMS = ["0", "auto"]
LONG_TURN_COLUMNS = ["seconds", "prefill", "decode", "kv_cache"]
SESSIONS = 32
CONTEXT = 2_000
EPISODES = 16
NEW_TOKENS = 16


def model_dir() -> Path:
    """SmolLM2-135M-Instruct's folder, fetched once per machine."""
    from agentgym_core.modeling.fetch import fetch

    return fetch("smollm2-135m-instruct", log=None)


def interleaved(arms: list[str], repeats: int, flag: str, *options: str) -> dict[str, list]:
    """Each arm `repeats` times, each time a fresh process of this script (`flag ARM options`),
    the arms interleaved within each repeat; per arm, the JSON each process printed last.

    An arm `ARM@COMMIT` runs this script with that commit's `agentgym_core` and `benchmarks`
    package (a git worktree made for the command, first on the child's path; the plugins
    are the installed ones): a change measured against the code before it, by the same
    measurement, in one command.
    """
    runs: dict[str, list] = {arm: [] for arm in arms}
    with contextlib.ExitStack() as stack:
        code = {
            arm: str(stack.enter_context(worktree(arm.partition("@")[2])))
            for arm in arms
            if "@" in arm
        }
        for _ in range(repeats):
            for arm in runs:
                command = [sys.executable, __file__, flag, arm.partition("@")[0], *options]
                env = {**os.environ, CODE: code[arm]} if arm in code else None
                out = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
                runs[arm].append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs


@contextlib.contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """A detached git worktree of `commit`, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=f"smollm2-{commit}-") as parent:
        tree = Path(parent) / "tree"
        git = ["git", "-C", str(ROOT), "worktree"]
        run = functools.partial(subprocess.run, check=True, capture_output=True)
        run([*git, "add", "--detach", str(tree), commit])
        try:
            yield tree
        finally:
            run([*git, "remove", "--force", str(tree)])


# -- updates ----------------------------------------------------------------------------------


def one_update_run(arm: str, updates: int) -> dict:
    """In this (fresh) process: `benchmarks/lora.py`'s measurement of one arm on SmolLM2."""
    import benchmarks.lora as lora

    if arm.endswith(":all-logits"):
        import agentgym_core.learner.forward as forward

        forward._logits_only_at = lambda model, columns: {}
        arm = arm.removesuffix(":all-logits")
    result = lora.one_memory_run(model_dir(), arm, updates)
    result["tokens_per_s"] = 16 * 384 / result["seconds"]
    return result


def updates(args: argparse.Namespace) -> None:
    """Every arm in its own process, interleaved per repeat; a markdown table."""
    arms = args.arms or UPDATE_ARMS
    runs = interleaved(arms, args.repeats, "--one-update", "--updates", str(args.updates))
    base = statistics.median(r["tokens_per_s"] for r in next(iter(runs.values())))
    print(f"\nSmolLM2-135M-Instruct, 16 x 384 tokens a batch; median of {args.repeats}\n")
    print("| arm | trainable | s / update | tokens/s | vs first | peak RSS over baseline MiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    for arm, results in runs.items():
        rate = statistics.median(r["tokens_per_s"] for r in results)
        print(
            f"| {arm} | {statistics.median(r['trainable'] for r in results) / 1e6:.2f} M | "
            f"{statistics.median(r['seconds'] for r in results):.2f} | {rate:.0f} | "
            f"{rate / base:.2f}x | {statistics.median(r['peak_mib'] for r in results):.0f} |"
        )


# -- generation -------------------------------------------------------------------------------


def make_policy(arm: str, model, tokenizer):
    """The arm's policy over the loaded model."""
    if arm.startswith("vllm"):
        from agentgym_policy_vllm import VLLMPolicy, VLLMPolicyConfig

        config = VLLMPolicyConfig(kv_cache_gib=2.0, enforce_eager=True, max_num_seqs=64)
        return VLLMPolicy(config, model=model, tokenizer=tokenizer)
    from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig

    return HFPolicy(HFPolicyConfig(), model=model, tokenizer=tokenizer)


def load(arm: str):
    """The model as the arm runs it (hf-before: transformers' sdpa, a cache grown by cat)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import agentgym_core.policies.hf as hf
    from agentgym_core.modeling.attention import prefer_sdpa_gqa
    from agentgym_core.policies.growing_cache import growing

    hf.growing = (lambda cache, room: cache) if arm == "hf-before" else growing
    dtype = torch.bfloat16 if arm.endswith(":bf16") else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir(), dtype=dtype)
    if arm != "hf-before":
        prefer_sdpa_gqa(model)
    return model, AutoTokenizer.from_pretrained(model_dir())


def play(arm: str, turns: int) -> dict:
    """The arm's seconds and sampled tokens for the benchmark's episodes."""
    from agentgym_env_babyai import BabyAIConfig
    from agentgym_env_babyai.plugin import make_babyai

    from agentgym_core.rollout.chat import ChatFormat
    from agentgym_core.rollout.engine import EpisodeSpec, RolloutEngine, RolloutSettings

    model, tokenizer = load(arm)
    policy = make_policy(arm, model, tokenizer)
    config = BabyAIConfig(levels="agentgym", list_actions=True)
    chat = ChatFormat(tokenizer, model.generation_config)
    engine = RolloutEngine(lambda: make_babyai(config), policy, chat)
    episodes = [EpisodeSpec(task, group=task) for task in range(EPISODES)]
    settings = RolloutSettings(
        max_turns=turns,
        max_new_tokens=NEW_TOKENS,
        constrained=False,
        seed=3,
        max_context_tokens=4096,
    )
    try:
        start = time.perf_counter()
        trajectories = engine.run(episodes, settings)
        seconds = time.perf_counter() - start
    finally:
        engine.close()
        policy.close()
    sampled = sum(t.num_sampled_tokens for t in trajectories)
    context = sum(len(t.token_ids) for t in trajectories)
    return {"arm": arm, "seconds": seconds, "sampled": sampled, "context": context}


def generation(args: argparse.Namespace) -> None:
    """Every arm in its own process, interleaved per repeat; a markdown table."""
    arms = args.arms or GENERATE_ARMS
    runs = interleaved(arms, args.repeats, "--one-play", "--turns", str(args.turns))
    first = next(iter(runs.values()))
    base = statistics.median(r["seconds"] for r in first)
    print(
        f"\n{EPISODES} free-text episodes x {args.turns} turns x {NEW_TOKENS} tokens; "
        f"median of {args.repeats}\n"
    )
    print("| arm | seconds | sampled tokens/s | context tokens | speed vs first |")
    print("| --- | --- | --- | --- | --- |")
    for arm, results in runs.items():
        seconds = statistics.median(r["seconds"] for r in results)
        sampled = statistics.median(r["sampled"] / r["seconds"] for r in results)
        context = statistics.median(r["context"] for r in results)
        print(f"| {arm} | {seconds:.1f} | {sampled:.1f} | {context:.0f} | {base / seconds:.2f}x |")


# -- one prefill ------------------------------------------------------------------------------


def prefill(args: argparse.Namespace) -> None:
    """One forward pass over 16 prompts of 557 tokens (a first turn's), left-padded rows."""
    import torch
    from transformers import AutoModelForCausalLM

    from agentgym_core.modeling.attention import register

    register()
    ids = torch.randint(0, 40_000, (16, 557), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[:8, :5] = 0
    arms = [(d, a) for d in ("float32", "bfloat16") for a in ("sdpa", "sdpa_gqa")]
    times: dict[tuple[str, str], list[float]] = {arm: [] for arm in arms}
    models = {
        (d, a): AutoModelForCausalLM.from_pretrained(
            model_dir(), dtype=getattr(torch, d), attn_implementation=a
        ).eval()
        for d, a in arms
    }
    with torch.no_grad():
        for _ in range(args.repeats):
            for arm in arms:
                start = time.perf_counter()
                models[arm](input_ids=ids, attention_mask=mask, logits_to_keep=1)
                times[arm].append(time.perf_counter() - start)
    print(f"\none forward pass of 16 x 557 tokens; median of {args.repeats}\n")
    print("| dtype | attention | seconds | tokens/s |")
    print("| --- | --- | --- | --- |")
    for (dtype, attention), seconds in times.items():
        median = statistics.median(seconds)
        print(f"| {dtype} | {attention} | {median:.2f} | {ids.numel() / median:.0f} |")


# -- long turns -------------------------------------------------------------------------------


def long_turns(args: argparse.Namespace) -> None:
    """Each arm in a fresh process, interleaved per repeat; per turn, medians over repeats."""
    arms = args.arms or LONG_TURN_ARMS
    sizes = ["--sessions", str(args.sessions), "--context", str(args.context)]
    runs = interleaved(arms, args.repeats, "--one-long", "--turns", str(args.turns), *sizes)
    print(
        f"\n{args.sessions} sessions, first prompts of {args.context} tokens, then turns of "
        f"100 new tokens and {NEW_TOKENS} sampled; seconds: the turn's wall time, then the "
        f"policy's timers; medians of {args.repeats}; peak RSS: the process's high-water mark "
        "by the turn's end (model load included), first repeat\n"
    )
    print("| arm | turn | context | seconds | prefill | decode | kv_cache | peak RSS MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for arm, results in runs.items():
        for turn in range(args.turns):
            rows = [r[turn] for r in results]
            cells = [statistics.median(r[key] for r in rows) for key in LONG_TURN_COLUMNS]
            figures = " | ".join(f"{value:.1f}" for value in cells)
            print(f"| {arm} | {turn} | {rows[0]['context']} | {figures} | {rows[0]['peak']:.0f} |")
    first, *others = runs
    if args.turns < 2:
        return  # the ratio is of the turns after the first
    later = {arm: [sum(t["seconds"] for t in r[1:]) for r in runs[arm]] for arm in runs}
    for arm in others:
        ratio = statistics.median(later[first]) / statistics.median(later[arm])
        print(f"\nturns 1-{args.turns - 1}: {arm} {ratio:.2f}x the speed of {first}")


def split_prefill(args: argparse.Namespace) -> None:
    """Each `split_prefill_tokens` arm in a fresh process, interleaved per repeat."""
    arms = args.arms or SPLIT_ARMS
    options = ["--tasks", str(args.tasks)] + (["--free"] if args.free else [])
    runs = interleaved(arms, args.repeats, "--one-split", *options)
    mode = "free text" if args.free else "constrained"
    print(
        f"\nAgentGym's first {args.tasks} BabyAI test tasks, {mode}, 20 turns, 24 in "
        f"flight; medians of {args.repeats}; tokens: the prefills' real and padded positions\n"
    )
    print("| split_prefill_tokens | seconds | prefill s | decode s | real | padded | speed |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    base = statistics.median(r["seconds"] for r in next(iter(runs.values())))
    for arm, results in runs.items():
        median = {key: statistics.median(r[key] for r in results) for key in results[0]}
        print(
            f"| {arm} | {median['seconds']:.1f} | {median['prefill']:.1f} | "
            f"{median['decode']:.1f} | {median['real']:.0f} | {median['padded']:.0f} | "
            f"{base / median['seconds']:.2f}x |"
        )


def one_split_run(arm: str, tasks: int, free: bool) -> dict:
    """AgentGym's BabyAI test tasks through `hf` with `split_prefill_tokens: arm`."""
    from agentgym_env_babyai import BabyAIConfig
    from agentgym_env_babyai.plugin import make_babyai

    from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig
    from agentgym_core.rollout.chat import ChatFormat
    from agentgym_core.rollout.engine import EpisodeSpec, RolloutEngine, RolloutSettings
    from agentgym_core.run.components import load_model

    model, tokenizer = load_model(model_dir(), "bfloat16")
    split = arm if arm == "auto" else int(arm)
    policy = HFPolicy(HFPolicyConfig(split_prefill_tokens=split), model=model, tokenizer=tokenizer)
    config = BabyAIConfig(levels="agentgym", list_actions=True, agentgym_prompt=True)
    env = make_babyai(config)
    chosen = env.tasks("test")[:tasks]
    env.close()
    engine = RolloutEngine(lambda: make_babyai(config), policy, ChatFormat(tokenizer))
    settings = RolloutSettings(
        max_turns=20,
        max_new_tokens=32,
        constrained=not free,
        seed=0,
        concurrency=24,
        max_context_tokens=4096,
    )
    try:
        start = time.perf_counter()
        engine.run([EpisodeSpec(task, group=task) for task in chosen], settings)
        seconds = time.perf_counter() - start
    finally:
        engine.close()
        policy.close()
    return {
        "seconds": seconds,
        "prefill": policy.seconds["prefill"],
        "decode": policy.seconds["decode"],
        "real": policy.cache.computed_tokens,
        "padded": policy.cache.padded_tokens,
    }


def sampler_gap(args: argparse.Namespace) -> None:
    """Each `kv_cache_dtype` arm in a fresh process; the sampler's distance from the learner."""
    runs = interleaved(args.arms or LONG_TURN_ARMS, 1, "--one-gap", "--turns", str(args.turns))
    print(
        f"\n{EPISODES} free-text BabyAI episodes x {args.turns} turns, SmolLM2 in bfloat16 "
        "loaded as a run loads it; |sampler - learner| log-prob of each sampled token, the "
        "learner scoring as an update does (training mode, gradients on)\n"
    )
    print("| kv_cache_dtype | sampled tokens | mean | max |")
    print("| --- | --- | --- | --- |")
    for arm, (result,) in runs.items():
        print(f"| {arm} | {result['tokens']} | {result['mean']:.2e} | {result['max']:.2e} |")


def one_gap_run(arm: str, turns: int) -> dict:
    """Play the episodes with `kv_cache_dtype: arm`, then score them as the learner does."""
    import torch
    from agentgym_env_babyai import BabyAIConfig
    from agentgym_env_babyai.plugin import make_babyai

    from agentgym_core.learner.forward import token_logprobs
    from agentgym_core.learner.packing import pack
    from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig
    from agentgym_core.rollout.chat import ChatFormat
    from agentgym_core.rollout.engine import EpisodeSpec, RolloutEngine, RolloutSettings
    from agentgym_core.run.components import load_model

    model, tokenizer = load_model(model_dir(), "bfloat16")
    policy = HFPolicy(HFPolicyConfig(kv_cache_dtype=arm), model=model, tokenizer=tokenizer)
    config = BabyAIConfig(levels="agentgym", list_actions=True, agentgym_prompt=True)
    engine = RolloutEngine(lambda: make_babyai(config), policy, ChatFormat(tokenizer))
    settings = RolloutSettings(
        max_turns=turns,
        max_new_tokens=NEW_TOKENS,
        constrained=False,
        seed=3,
        max_context_tokens=4096,
    )
    try:
        trajectories = engine.run([EpisodeSpec(t, group=t) for t in range(EPISODES)], settings)
    finally:
        engine.close()
        policy.close()
    gaps = []
    model.train()
    for mb in pack(trajectories, row_tokens=None, micro_batch_tokens=4096):
        logprobs, _ = token_logprobs(model, mb, 1.0)  # gradients on, as in an update
        mask = mb.mask.bool()
        gaps.append((logprobs.detach()[mask].float() - mb.sampler_logprobs[mask]).abs())
    gap = torch.cat(gaps)
    return {"tokens": gap.numel(), "mean": float(gap.mean()), "max": float(gap.max())}


def one_long_run(arm: str, turns: int, sessions: int, context: int) -> list[dict]:
    """`turns` turns of the `hf` policy on SmolLM2 in bfloat16; `arm`: `KV_CACHE_DTYPE` or
    `KV_CACHE_DTYPE:BATCHING`.

    The model loaded as a run loads it (`load_model`: `sdpa_gqa`, and float32 kernels
    where the CPU emulates bfloat16).
    """
    import asyncio

    import torch

    from agentgym_core.interfaces import SamplingParams
    from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig
    from agentgym_core.run.components import load_model

    model, tokenizer = load_model(model_dir(), "bfloat16")
    kv_dtype, _, batching = arm.partition(":")
    config = HFPolicyConfig(kv_cache_dtype=kv_dtype, batching=batching or "static")
    policy = HFPolicy(config, model=model, tokenizer=tokenizer)
    draw = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(100, 40_000, (context,), generator=draw).tolist() for _ in range(sessions)
    ]
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=1.0)
    rows: list[dict] = []

    async def play() -> None:
        nonlocal prompts
        for _ in range(turns):
            policy.seconds.clear()
            start = time.perf_counter()
            outs = await asyncio.gather(
                *(policy.generate(p, params, session=i) for i, p in enumerate(prompts))
            )
            parts = policy.seconds
            rows.append(
                {
                    "context": len(prompts[0]),
                    "seconds": time.perf_counter() - start,
                    **{part: parts[part] for part in LONG_TURN_COLUMNS[1:]},
                    "peak": peak_rss_mib(),
                }
            )
            tails = [torch.randint(100, 40_000, (100,), generator=draw).tolist() for _ in outs]
            prompts = [p + o.token_ids + t for p, o, t in zip(prompts, outs, tails, strict=True)]

    asyncio.run(play())
    policy.close()
    return rows


def main(argv: list[str] | None = None) -> None:
    """Parse the mode and run it."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--update", action="store_true", help="the update arms")
    parser.add_argument("--generate", action="store_true", help="the generation arms")
    parser.add_argument("--prefill", action="store_true", help="one forward pass, 4 ways")
    parser.add_argument("--long-turns", action="store_true", help="hf turns at long contexts")
    parser.add_argument("--arms", nargs="*", help="a subset of the mode's arms, in this order")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--updates", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--one-update", help=argparse.SUPPRESS)
    parser.add_argument("--one-play", help=argparse.SUPPRESS)
    parser.add_argument("--one-long", help=argparse.SUPPRESS)
    parser.add_argument("--sessions", type=int, default=SESSIONS, help="--long-turns: sessions")
    parser.add_argument("--context", type=int, default=CONTEXT, help="--long-turns: first prompt")
    parser.add_argument("--split-prefill", action="store_true", help="hf's prefill groups")
    parser.add_argument("--tasks", type=int, default=36, help="--split-prefill: test tasks")
    parser.add_argument("--free", action="store_true", help="--split-prefill: free text")
    parser.add_argument("--one-split", help=argparse.SUPPRESS)
    parser.add_argument("--sampler-gap", action="store_true", help="bf16 sampler vs learner")
    parser.add_argument("--one-gap", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one_update:
        print(json.dumps(one_update_run(args.one_update, args.updates)))
    elif args.one_play:
        print(json.dumps(play(args.one_play, args.turns)))
    elif args.one_long:
        print(json.dumps(one_long_run(args.one_long, args.turns, args.sessions, args.context)))
    elif args.one_split:
        print(json.dumps(one_split_run(args.one_split, args.tasks, args.free)))
    elif args.split_prefill:
        split_prefill(args)
    elif args.one_gap:
        print(json.dumps(one_gap_run(args.one_gap, args.turns)))
    elif args.sampler_gap:
        sampler_gap(args)
    elif args.update:
        updates(args)
    elif args.generate:
        generation(args)
    elif args.prefill:
        prefill(args)
    elif args.long_turns:
        long_turns(args)
    else:
        parser.error(
            "choose --update, --generate, --prefill, --long-turns, --split-prefill or --sampler-gap"
        )


if __name__ == "__main__":
    main()
    # done and printed: skip the interpreter's teardown, which aborted the process where the
    # `hf` policy's close did not wait for its continuous decoder (an `@COMMIT` arm's code)
    sys.stdout.flush()
    os._exit(0)
