"""`sdpa_gqa`: transformers' sdpa attention without copies of grouped keys and values."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentgym_core.modeling.attention import prefer_sdpa_gqa
from agentgym_core.policies.growing_cache import growing


def _pair(dtype=torch.float32):
    config = Qwen2Config(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,  # grouped: 3 query heads per key/value head
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    plain = Qwen2ForCausalLM(config)
    with torch.no_grad():  # a fresh init's near-uniform attention would hide a wrong mask
        for parameter in plain.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape))
    plain = plain.to(dtype).eval()
    grouped = Qwen2ForCausalLM(copy.deepcopy(config)).to(dtype).eval()  # its own config
    grouped.load_state_dict(plain.state_dict())
    prefer_sdpa_gqa(grouped)
    assert grouped.config._attn_implementation == "sdpa_gqa"
    assert plain.config._attn_implementation == "sdpa"
    return plain, grouped


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 0.1)])
def test_prefill_and_decode_with_masks_give_sdpas_logits(dtype, tolerance):
    plain, grouped = _pair(dtype)
    ids = torch.randint(0, 300, (3, 12))
    mask = torch.ones(3, 14, dtype=torch.long)
    mask[0, :4] = 0  # left padding, as a rollout batch has
    mask[2, :7] = 0
    with torch.no_grad():
        a = plain(input_ids=ids, attention_mask=mask[:, :12], use_cache=True)
        b = grouped(input_ids=ids, attention_mask=mask[:, :12], use_cache=True)
        real = mask[:, :12].bool()
        torch.testing.assert_close(a.logits[real], b.logits[real], rtol=0, atol=tolerance)
        cache_a, cache_b = a.past_key_values, growing(b.past_key_values, room=2)
        for step in range(2):
            token = torch.tensor([[7 + step], [9], [11]])
            position = mask[:, : 12 + step].sum(1, keepdim=True)
            seen = mask[:, : 13 + step]
            a = plain(
                input_ids=token, attention_mask=seen, position_ids=position, past_key_values=cache_a
            )
            b = grouped(
                input_ids=token, attention_mask=seen, position_ids=position, past_key_values=cache_b
            )
            torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=tolerance)


def test_gradients_are_sdpas():
    plain, grouped = _pair()
    ids = torch.randint(0, 300, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :3] = 0
    for model in (plain, grouped):
        model.train()
        model(input_ids=ids, attention_mask=mask).logits[mask.bool()].logsumexp(-1).sum().backward()
    for (name, p), q in zip(plain.named_parameters(), grouped.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
