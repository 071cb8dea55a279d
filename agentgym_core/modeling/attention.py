"""`sdpa_gqa`: transformers' SDPA attention, without its copies of grouped keys and values.

Models with grouped-query attention (Llama 3, Qwen2, SmolLM2: 3 key/value heads
for 9 query heads) keep fewer key/value heads than query heads. transformers'
`sdpa` lets PyTorch's kernel read the groups in place (`enable_gqa`) only when
there is no attention mask; with one, it first copies every key and value once
per query head (`repeat_kv`). Rollouts always have a mask (a batch's rows are
left-padded, each episode's cache has its own length), so on a CPU each decoded
token copied the whole cache three times over on SmolLM2.

`sdpa_gqa` computes the same attention from the same masks, on a CPU:
- with `enable_gqa` whatever the mask;
- for a decoded token (one query), as two batched matrix products over each
  key/value head's group of query heads: PyTorch's CPU flash kernel is slow
  for a single query, in bfloat16 eight times slower than this.
Given a cache wider than the queries (`cache_dtype`: float32 for a bfloat16
model on a CPU without bfloat16 instructions) it attends in the cache's dtype.
For a batch that trains in bfloat16 on such a CPU it runs the kernel on float32
copies (`modeling/cpu_bf16.py` says why): the
backward pass's emulated bfloat16 products were most of a LoRA update's extra
time. On other devices it is transformers' `sdpa`, unchanged (a CUDA kernel given a
mask and `enable_gqa` falls back to its slowest path).
"""

from __future__ import annotations

from typing import Any

import torch

from agentgym_core.modeling.cpu_bf16 import bf16_is_emulated

NAME = "sdpa_gqa"
"""The `attn_implementation` name it is registered under."""


def sdpa_gqa_forward(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of [batch, heads, tokens, dim] inputs, output [batch, tokens, heads, dim]."""
    if query.device.type != "cpu":
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs
        )
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    low = query.dtype
    if key.dtype != low:  # a cache wider than the model (`cache_dtype`): attend in its dtype
        query = query.to(key.dtype)
    if query.shape[2] == 1 and dropout == 0.0:
        return _one_query(query, key, value, attention_mask, scale).to(low), None
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal and attention_mask is None and query.shape[2] > 1)
    if low == torch.bfloat16 and torch.is_grad_enabled() and bf16_is_emulated():
        # the backward pass's bfloat16 products are emulated on this CPU (a LoRA update of
        # SmolLM2 went from 0.61x to 0.93x float32's speed: benchmarks/cpu_bf16.py); the
        # forward pass, as fast either way in a probe, is left as it was when sampling
        query, key, value = query.float(), key.float(), value.float()
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.to(query.dtype)  # an additive mask: the kernel's dtype
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scale,
        is_causal=causal,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.to(low).transpose(1, 2).contiguous(), None


def _one_query(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """One query token per row: each key/value head's query heads as the rows of one product.

    Scores and softmax in float32, as the flash kernel accumulates them.
    """
    rows, heads, _, dim = query.shape
    groups, width = key.shape[1], key.shape[2]
    grouped = query.reshape(rows, groups, heads // groups, dim)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float() * scale
    if mask is not None:
        keep = mask.reshape(rows, 1, 1, width) if mask.dtype == torch.bool else None
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        else:  # an additive float mask
            scores = scores + mask.reshape(rows, 1, 1, width).float()
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(weights, value)  # [rows, groups, heads per group, dim]
    return out.reshape(rows, 1, heads, dim)


def cache_dtype(model: Any) -> torch.dtype | None:
    """The dtype to keep `model`'s KV cache in when sampling; None: its keys' own.

    float32 for a bfloat16 model that attends with `sdpa_gqa` on a CPU without
    bfloat16 instructions: there a decoded token's products with a bfloat16 cache
    are emulated (SmolLM2, 32 sessions at 2,000 tokens: decoding 4.4x slower than with
    float32, `benchmarks/smollm2.py --long-turns`), and converting the cache at each step
    cost more than it saved in a probe. The keys are the
    model's bfloat16 values, held exactly; the cache takes twice the memory.
    """
    weight = next(model.parameters(), None)
    config = getattr(model, "config", None)
    if weight is None or getattr(config, "_attn_implementation", None) != NAME:
        return None
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16:
        return None
    return torch.float32 if bf16_is_emulated() else None


def register() -> str:
    """Register `sdpa_gqa` with transformers (idempotent); returns its name.

    Its masks are `sdpa`'s (boolean, True where a key may be attended).
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(NAME, sdpa_gqa_forward)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return NAME


def prefer_sdpa_gqa(model: Any) -> None:
    """Switch a model that runs transformers' `sdpa` to `sdpa_gqa` (others keep theirs)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return
    if not model._can_set_attn_implementation():
        return
    model.set_attn_implementation(register())
