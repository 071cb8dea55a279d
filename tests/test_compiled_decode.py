"""`compile_decode`: the `hf` policy's decode step through torch.compile gives the same
tokens and log-probs as the plain step, and compiles once, not once a token."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch
from colour_env import ColourEnv

from agentgym_core.interfaces import SamplingParams
from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig


def _turns(policy: HFPolicy, tokenizer) -> list:
    """Two turns of five episodes (prompts of different lengths; greedy, seeded and
    constrained), the second reusing the first's keys: every generation, in order."""
    vocab = len(tokenizer)
    prompts = [[(7 * i + j) % (vocab - 3) + 3 for j in range(4 + 5 * i)] for i in range(5)]
    env = ColourEnv()
    env.reset(0)
    actions = env.valid_actions()[:3]

    async def turn(number: int) -> list:
        calls = []
        for i, prompt in enumerate(prompts):
            params = SamplingParams(max_new_tokens=9, greedy=i == 0, seed=10 * number + i)
            allowed = actions if i == 4 else None
            calls.append(policy.generate(prompt, params, allowed, session=i))
        return await asyncio.gather(*calls)

    done = []
    for number in range(2):
        generations = asyncio.run(turn(number))
        done += generations
        for prompt, generation in zip(prompts, generations, strict=True):
            prompt += generation.token_ids + [5, 9, 11][: number + 1]
    return done


def _policy(model, tokenizer, compiled: bool, backend: str | None = "eager") -> HFPolicy:
    # split_prefill_tokens 1: prompts of different lengths prefill in groups, into buffers
    # without room when compiled
    config = HFPolicyConfig(
        max_batch_size=8, compile_decode=compiled, gather_ms=50.0, split_prefill_tokens=1
    )
    policy = HFPolicy(config, model=model, tokenizer=tokenizer)
    policy.compile_backend = backend  # eager: the compiled path without C++ code generation
    policy.group_counts = []  # prefill groups per batch
    prefill = policy._prefill

    def counted(pre, sizes, *args):
        policy.group_counts.append(len(sizes))
        return prefill(pre, sizes, *args)

    policy._prefill = counted
    return policy


def _both(model, tokenizer, backend: str | None) -> tuple[list, list, int]:
    """The generations of `_turns` with the plain step, then with the compiled one, and
    the compiled buffers' capacity."""
    plain_policy = _policy(model, tokenizer, False)
    try:
        plain = _turns(plain_policy, tokenizer)
    finally:
        plain_policy.close()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    policy = _policy(model, tokenizer, True, backend)
    try:
        compiled = _turns(policy, tokenizer)
        capacity = policy._compiled_decode.capacity
        assert max(policy.group_counts) > 1  # some batch prefilled in groups
    finally:
        policy.close()
    assert policy._compiled_decode is None  # closing frees the buffers
    return plain, compiled, capacity


def test_compiled_decoding_samples_as_the_plain_step_and_compiles_once(tiny_model):
    model, tokenizer = tiny_model
    plain, compiled, capacity = _both(model, tokenizer, "eager")
    counters = torch._dynamo.utils.counters
    assert capacity == 256
    assert sum(len(g.token_ids) for g in compiled) > 40  # many decode steps
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert any(g.allowed[0] is not None for g in compiled)  # the constrained row
    for one, other in zip(plain, compiled, strict=True):
        assert one.token_ids == other.token_ids
        assert one.text == other.text
        assert one.logprobs == pytest.approx(other.logprobs, abs=1e-5)


def test_compiled_decoding_is_for_static_batching():
    with pytest.raises(ValueError, match="compile_decode needs batching: static"):
        HFPolicyConfig(batching="continuous", compile_decode=True)
    assert HFPolicyConfig(batching="continuous", compile_decode="auto").compile_decode == "auto"
    assert HFPolicyConfig(compile_decode="true").compile_decode is True  # from a dotlist
    assert HFPolicyConfig().compile_decode is False


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: make test-gpu")
def test_compiled_decoding_on_the_gpu_samples_as_the_plain_step(tiny_model):
    """Inductor and CUDA graphs (mode reduce-overhead), float32: the plain step's tokens;
    log-probs up to the fused kernels' rounding."""
    model, tokenizer = tiny_model
    model = copy.deepcopy(model).to("cuda")  # the fixture's model stays on the CPU
    plain, compiled, capacity = _both(model, tokenizer, None)
    assert capacity == 256
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    for one, other in zip(plain, compiled, strict=True):
        assert one.token_ids == other.token_ids
        assert one.logprobs == pytest.approx(other.logprobs, abs=1e-4)
