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


@pytest.mark.parametrize("emulated", [False, True])
def test_bf16_training_attention_on_a_cpu_that_emulates_bf16_runs_in_float32(monkeypatch, emulated):
    """Where bfloat16 is emulated, a training pass's attention runs on float32 copies (a
    sampling pass's does not: its forward is as fast either way); the output and the input
    gradients stay bfloat16, within bfloat16's rounding of the exact ones."""
    import agentgym_core.modeling.attention as attention

    kernel, seen = torch.nn.functional.scaled_dot_product_attention, []

    def spy(query, *args, **kwargs):
        seen.append(query.dtype)
        return kernel(query, *args, **kwargs)

    monkeypatch.setattr(attention, "bf16_is_emulated", lambda: emulated)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    torch.manual_seed(0)
    shapes = [(2, 6, 40, 16), (2, 2, 40, 16), (2, 2, 40, 16)]  # 3 query heads per group
    low = [torch.randn(s).to(torch.bfloat16).requires_grad_() for s in shapes]
    exact = [t.detach().double().requires_grad_() for t in low]  # the same values, in float64
    module = torch.nn.Module()
    module.is_causal = True
    with torch.no_grad():
        attention.sdpa_gqa_forward(module, *low, attention_mask=None)
    out_low, _ = attention.sdpa_gqa_forward(module, *low, attention_mask=None)
    assert seen == [torch.bfloat16, torch.float32 if emulated else torch.bfloat16]
    out_exact, _ = attention.sdpa_gqa_forward(module, *exact, attention_mask=None)
    grad = torch.randn(out_exact.shape, dtype=torch.float64)
    out_low.backward(grad.to(torch.bfloat16))
    out_exact.backward(grad)
    assert out_low.dtype == torch.bfloat16
    for mine, true in zip(low, exact, strict=True):
        assert mine.grad.dtype == torch.bfloat16
        error = (mine.grad.double() - true.grad).abs().mean() / true.grad.abs().mean()
        assert float(error) < 0.01  # bfloat16's rounding of the output's gradient and the inputs'
