"""The policy's forward pass over packed micro-batches: per-token log-probabilities and entropy.

Only agent tokens carry loss, and they are a small share of a multi-turn
sequence, so the output projection, log-softmax and entropy run on their
positions alone: the [tokens, vocab] logits of the whole batch are never built.
Logits are divided by the sampling temperature and restricted to the sampler's
allowed ids where decoding was constrained, so the learner scores exactly the
distribution that sampled.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from transformers import DynamicCache

from agentgym_core.learner.packing import MicroBatch, pack
from agentgym_core.policies.constraints import allowed_mask
from agentgym_core.policies.prefix_cache import per_request
from agentgym_core.types import Trajectory


def token_logprobs(
    model: Any, batch: MicroBatch, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of the targets and the entropy, both [rows, width], 0 off agent tokens."""
    logprobs, entropy, _ = policy_forward(model, batch, temperature)
    return logprobs, entropy


def policy_forward(
    model: Any,
    batch: MicroBatch,
    temperature: float,
    *,
    hidden: bool = False,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`token_logprobs`, plus the last hidden state [rows, width, hidden] when `hidden`.

    `entropy_grad=False` computes the entropy as a metric only (no autograd graph).
    """
    device = next(model.parameters()).device
    mask = batch.mask.to(device).bool()
    columns = mask.any(0).nonzero().squeeze(1)  # every column holding an agent token
    out = run_model(model, batch, output_hidden_states=hidden, **_logits_only_at(model, columns))
    logits = out.logits if out.logits.shape[1] == columns.numel() else out.logits[:, columns]
    picked = logits[mask[:, columns]].float() / temperature  # [agent tokens, vocab], row-major
    if batch.constrained_at:
        picked = _constrain(picked, mask, batch)
    logp = torch.log_softmax(picked, dim=-1)
    chosen = logp.gather(1, batch.targets.to(device)[mask].unsqueeze(1)).squeeze(1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        finite = logp.masked_fill(~torch.isfinite(logp), 0.0)
        entropy = -(logp.exp() * finite).sum(-1)
    zeros = torch.zeros(mask.shape, device=device)
    last = out.hidden_states[-1] if hidden else None
    return zeros.masked_scatter(mask, chosen), zeros.masked_scatter(mask, entropy), last


def run_model(model: Any, batch: MicroBatch, **kwargs: Any) -> Any:
    """The model (a causal LM or its bare body) on the batch's rows; `kwargs` go to its forward.

    With shared prompts (`batch.prefixes`) the prompts run first, once each, and
    their keys and values (in the autograd graph) are copied to the rows that
    continue them; each row then attends to its own prompt and its own columns.
    """
    device = next(model.parameters()).device
    rows = {
        "input_ids": batch.input_ids.to(device),
        "position_ids": batch.position_ids.to(device),
    }
    prefixes = batch.prefixes
    if prefixes is None:
        return model(**rows, use_cache=False, **kwargs)
    # right-padded prompts under plain causal attention: the padding comes after every real
    # token, so no real token sees it; the rows' key mask hides it from them
    prompts = model(input_ids=prefixes.input_ids.to(device), use_cache=True, **_no_logits(model))
    of_row = prefixes.of_row.tolist()
    cache = DynamicCache(
        ddp_cache_data=[
            per_request(of_row, layer.keys, layer.values)
            for layer in prompts.past_key_values.layers
        ]
    )
    mask = prefixes.key_mask(batch.input_ids.shape[1]).to(device)
    return model(**rows, past_key_values=cache, attention_mask=mask, use_cache=False, **kwargs)


def _no_logits(model: Any) -> dict[str, Any]:
    """One position's logits where the model makes any (a prompt's are never used)."""
    return {"logits_to_keep": 1} if _takes_logits_to_keep(type(_bare(model))) else {}


def attention_implementation(model: Any) -> str:
    """The model's `config._attn_implementation` ("" when it has none)."""
    inner = getattr(model, "module", model)
    return getattr(getattr(inner, "config", None), "_attn_implementation", None) or ""


def _logits_only_at(model: Any, columns: torch.Tensor) -> dict[str, Any]:
    """`logits_to_keep` when the model's forward takes it (every transformers causal LM does)."""
    return {"logits_to_keep": columns} if _takes_logits_to_keep(type(_bare(model))) else {}


def _bare(model: Any) -> Any:
    """The transformers model inside DDP, FSDP and PEFT wrappers.

    Their forwards pass keyword arguments through to it.
    """
    inner = getattr(model, "module", model)  # DDP and FSDP keep the model in `.module`
    if hasattr(inner, "get_base_model"):
        inner = inner.get_base_model()
    return inner


@functools.cache
def _takes_logits_to_keep(model_type: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_type.forward).parameters


def _constrain(picked: torch.Tensor, mask: torch.Tensor, batch: MicroBatch) -> torch.Tensor:
    """-inf outside the sampler's allowed ids at the constrained agent positions."""
    row_of = torch.full(mask.shape, -1, dtype=torch.long, device=mask.device)
    row_of[mask] = torch.arange(picked.shape[0], device=mask.device)
    at = torch.as_tensor(batch.constrained_at, dtype=torch.long, device=mask.device)
    rows = row_of[at[:, 0], at[:, 1]].tolist()
    keep = [(r, ids) for r, ids in zip(rows, batch.constrained_ids, strict=True) if r >= 0]
    if not keep:
        return picked
    blocked = allowed_mask(
        [r for r, _ in keep], [ids for _, ids in keep], tuple(picked.shape), picked.device
    )
    return picked.masked_fill(blocked, float("-inf"))


def own_logprobs(
    model: Any, trajectory: Trajectory, temperature: float
) -> tuple[list[float], float, int]:
    """The model's log-probabilities of one trajectory, in `Trajectory.logprobs`' layout.

    Also returns their summed |difference| to the sampler's and the count of
    agent tokens. The trajectory is packed alone, so the values do not depend
    on how trajectories were batched or split across ranks.
    """
    (mb,) = pack([trajectory], row_tokens=None, micro_batch_tokens=len(trajectory.token_ids))
    logprobs, _ = token_logprobs(model, mb, temperature)
    mask = mb.mask[0].bool()
    fresh = torch.zeros(len(trajectory.token_ids))
    fresh[1:][mask[:-1]] = logprobs[0, :-1][mask[:-1]].float().cpu()
    diff = float((fresh[1:][mask[:-1]] - mb.sampler_logprobs[0, :-1][mask[:-1]]).abs().sum())
    return fresh.tolist(), diff, int(mask.sum())
