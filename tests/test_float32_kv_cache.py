"""A bfloat16 model's KV cache kept in float32 on a CPU that emulates bfloat16 (`kv_cache_dtype`).

There attention over a bfloat16 cache is emulated; over float32 it is not, and
it computes what the learner's training pass computes (`sdpa_gqa` attends on
float32 copies there), so the sampler comes closer to the learner, not further
(on a tiny model much closer; on SmolLM2 other bfloat16 roundings dominate:
`benchmarks/smollm2.py --sampler-gap`).
"""

from __future__ import annotations

import copy

import pytest
import torch
from colour_env import ColourEnv

import agentgym_core.modeling.attention as attention
from agentgym_core.learner.forward import token_logprobs
from agentgym_core.learner.packing import pack
from agentgym_core.modeling.attention import cache_dtype, prefer_sdpa_gqa
from agentgym_core.modeling.cpu_bf16 import compute_bf16_linears_in_float32
from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig
from agentgym_core.policies.prefix_cache import PrefixCache
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.rollout.engine import EpisodeSpec, RolloutEngine, RolloutSettings

SETTINGS = RolloutSettings(max_turns=4, seed=7, constrained=False, max_new_tokens=8)


@pytest.fixture
def emulated(monkeypatch):
    monkeypatch.setattr(attention, "bf16_is_emulated", lambda: True)


@pytest.fixture
def bf16_model(tiny_model):
    """The tiny model as `load_model` makes a bfloat16 one on a CPU that emulates bfloat16."""
    model, tokenizer = tiny_model
    low = copy.deepcopy(model).to(torch.bfloat16)
    torch.manual_seed(0)
    with torch.no_grad():  # larger weights: a fresh init's flat attention would hide differences
        for parameter in low.parameters():
            parameter.add_(0.05 * torch.randn_like(parameter))
    prefer_sdpa_gqa(low)
    compute_bf16_linears_in_float32(low, emulated=True)
    return low, tokenizer


def _play(model, tokenizer, kept: list, **options):
    """Episodes of 4 turns; `kept` gets the dtype of every session's stored keys."""
    policy = HFPolicy(HFPolicyConfig(**options), model=model, tokenizer=tokenizer)
    policy.compile_backend = "eager"  # if compiled: the path without C++ code generation
    put = policy.cache._put

    def spy(session, token_ids, layers):
        kept.append(layers[0][0].dtype)
        put(session, token_ids, layers)

    policy.cache._put = spy
    engine = RolloutEngine(
        lambda: ColourEnv(never_done=True), policy, ChatFormat(tokenizer, model.generation_config)
    )
    episodes = [EpisodeSpec(task, group=task, sample=s) for task in range(4) for s in range(2)]
    try:
        return engine.run(episodes, SETTINGS)
    finally:
        engine.close()


def _gap_to_the_learner(model, trajectories) -> float:
    """Mean |sampler - learner| log-prob of the sampled tokens, scored as training scores them."""
    (mb,) = pack(trajectories, row_tokens=4096, micro_batch_tokens=1 << 20)
    model.train()
    logprobs, _ = token_logprobs(model, mb, temperature=1.0)  # grad on, as in an update
    model.eval()
    mask = mb.mask.bool()
    return float((logprobs.detach()[mask].float() - mb.sampler_logprobs[mask]).abs().mean())


def test_auto_keeps_float32_keys_only_for_bf16_sdpa_gqa_on_an_emulating_cpu(
    tiny_model, bf16_model, monkeypatch
):
    model, _ = bf16_model
    monkeypatch.setattr(attention, "bf16_is_emulated", lambda: True)
    assert cache_dtype(model) is torch.float32
    assert cache_dtype(tiny_model[0]) is None  # float32 weights
    monkeypatch.setattr(attention, "bf16_is_emulated", lambda: False)
    assert cache_dtype(model) is None
    plain = copy.deepcopy(model)
    plain.set_attn_implementation("sdpa")  # its attention would not take a wider cache
    monkeypatch.setattr(attention, "bf16_is_emulated", lambda: True)
    assert cache_dtype(plain) is None


@pytest.mark.usefixtures("emulated")
@pytest.mark.parametrize("batching", ["static", "continuous"])
def test_a_float32_cache_samples_closer_to_what_the_learner_scores(bf16_model, batching):
    model, tokenizer = bf16_model
    wide, narrow = [], []
    float32_kept = _play(model, tokenizer, wide, batching=batching)
    bf16_kept = _play(model, tokenizer, narrow, kv_cache_dtype="model", batching=batching)
    assert wide and set(wide) == {torch.float32}
    assert narrow and set(narrow) == {torch.bfloat16}
    assert sum(len(t.token_ids) for t in float32_kept) > 500
    wide_gap = _gap_to_the_learner(model, float32_kept)  # 2e-5 seen
    narrow_gap = _gap_to_the_learner(model, bf16_kept)  # 2e-3 seen
    assert wide_gap < 1e-4 and narrow_gap > 10 * wide_gap


@pytest.mark.usefixtures("emulated")
def test_auto_leaves_the_compiled_decode_in_the_models_dtype(bf16_model):
    """The compiled step's fixed buffers take the model's keys as they are: bfloat16, and run."""
    model, tokenizer = bf16_model
    kept = []
    trajectories = _play(model, tokenizer, kept, compile_decode=True)
    assert kept and set(kept) == {torch.bfloat16}
    assert all(t.num_sampled_tokens > 0 for t in trajectories)


def test_an_additive_mask_follows_the_query_to_the_caches_dtype():
    """A float mask made for the bfloat16 model still fits the float32 attention it gets."""
    torch.manual_seed(0)
    query = torch.randn(2, 6, 5, 16).to(torch.bfloat16)
    keys, values = (torch.randn(2, 2, 9, 16).to(torch.bfloat16).float() for _ in range(2))
    allowed = torch.ones(2, 1, 5, 9, dtype=torch.bool)
    allowed[0, :, :, :3] = False  # a left-padded row
    additive = torch.zeros(allowed.shape, dtype=torch.bfloat16).masked_fill(~allowed, -1e4)
    module = torch.nn.Module()
    module.is_causal = False
    by_bool, _ = attention.sdpa_gqa_forward(module, query, keys, values, allowed)
    by_float, _ = attention.sdpa_gqa_forward(module, query, keys, values, additive)
    assert by_float.dtype == torch.bfloat16
    torch.testing.assert_close(by_float, by_bool, rtol=0, atol=0)


def test_a_prefix_caches_batch_buffers_take_its_dtype():
    cache = PrefixCache(kv_dtype=torch.float32)
    pre = cache.prefill([[1, 2, 3]], [None], pad_id=0, room=2)
    keys = torch.ones(1, 2, 3, 4, dtype=torch.bfloat16)
    k, v = pre.cache.update(keys, keys, 0)
    assert k.dtype == v.dtype == torch.float32
    torch.testing.assert_close(k, keys.float(), rtol=0, atol=0)  # held exactly
    assert pre.cache.layers[0]._key_buffer.shape[-2] == 5  # with room for the decoded tokens
