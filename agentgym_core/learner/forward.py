"""The policy's forward pass over packed micro-batches: per-token log-probabilities and entropy.

Only agent tokens carry loss, and they are a small share of a multi-turn
sequence, so the output projection, log-softmax and entropy run on their
positions alone: the [tokens, vocab] logits of the whole batch are never built.
Logits are divided by the sampling temperature and restricted to the sampler's
allowed ids where decoding was constrained, so the learner scores exactly the
distribution that sampled. With `chunk_tokens` the head runs on a few agent
tokens at a time, so not even the [agent tokens, vocab] logits exist at once
(`head.scores_in_chunks`).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from transformers import DynamicCache

from agentgym_core.learner.head import (
    Constraints,
    block,
    head_inputs,
    output_head,
    scores,
    scores_in_chunks,
)
from agentgym_core.learner.packing import MicroBatch, pack
from agentgym_core.policies.prefix_cache import per_request
from agentgym_core.types import Trajectory


def token_logprobs(
    model: Any, batch: MicroBatch, temperature: float, *, chunk_tokens: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of the targets and the entropy, both [rows, width], 0 off agent tokens."""
    logprobs, entropy, _ = policy_forward(model, batch, temperature, chunk_tokens=chunk_tokens)
    return logprobs, entropy


def policy_forward(
    model: Any,
    batch: MicroBatch,
    temperature: float,
    *,
    hidden: bool = False,
    entropy_grad: bool = True,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`token_logprobs`, plus the last hidden state [rows, width, hidden] when `hidden`.

    `entropy_grad=False` computes the entropy as a metric only (no autograd graph).
    `chunk_tokens`: run the output head on that many agent tokens at a time
    (`head.scores_in_chunks`: less memory, the same values up to rounding);
    None or 0: on all of them at once.
    """
    device = next(model.parameters()).device
    mask = batch.mask.to(device).bool()
    columns = mask.any(0).nonzero().squeeze(1)  # every column holding an agent token
    targets = batch.targets.to(device)[mask]  # row-major, as every [agent tokens, ..] tensor here
    constraints = _constraints(mask, batch, targets.numel())
    kwargs = {"output_hidden_states": hidden, **_logits_only_at(model, columns)}
    if chunk_tokens:
        head = output_head(_bare(model))
        with head_inputs(head) as seen:
            out = run_model(model, batch, **kwargs)
        states = _at_agent_tokens(seen[-1], mask, columns)  # the rows' call (prompts run first)
        chosen, entropy = scores_in_chunks(
            head, states, targets, temperature, chunk_tokens, constraints,
            entropy_grad=entropy_grad,
        )  # fmt: skip
    else:
        out = run_model(model, batch, **kwargs)
        logits = _at_agent_tokens(out.logits, mask, columns).float() / temperature
        chosen, entropy = scores(block(logits, constraints), targets, entropy_grad=entropy_grad)
    zeros = torch.zeros(mask.shape, device=device)
    last = out.hidden_states[-1] if hidden else None
    return zeros.masked_scatter(mask, chosen), zeros.masked_scatter(mask, entropy), last


def _at_agent_tokens(
    values: torch.Tensor, mask: torch.Tensor, columns: torch.Tensor
) -> torch.Tensor:
    """[agent tokens, ..] from [rows, width or len(columns), ..] (`logits_to_keep` kept columns)."""
    kept = values if values.shape[1] == columns.numel() else values[:, columns]
    return kept[mask[:, columns]]


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


def _constraints(mask: torch.Tensor, batch: MicroBatch, tokens: int) -> Constraints:
    """(agent-token index, allowed ids) of the batch's constrained agent positions."""
    if not batch.constrained_at:
        return []
    row_of = torch.full(mask.shape, -1, dtype=torch.long, device=mask.device)
    row_of[mask] = torch.arange(tokens, device=mask.device)
    at = torch.as_tensor(batch.constrained_at, dtype=torch.long, device=mask.device)
    rows = row_of[at[:, 0], at[:, 1]].tolist()
    return [(r, ids) for r, ids in zip(rows, batch.constrained_ids, strict=True) if r >= 0]


def own_logprobs(
    model: Any, trajectory: Trajectory, temperature: float, *, chunk_tokens: int | None = None
) -> tuple[list[float], float, int]:
    """The model's log-probabilities of one trajectory, in `Trajectory.logprobs`' layout.

    Also returns their summed |difference| to the sampler's and the count of
    agent tokens. The trajectory is packed alone, so the values do not depend
    on how trajectories were batched or split across ranks.
    """
    (mb,) = pack([trajectory], row_tokens=None, micro_batch_tokens=len(trajectory.token_ids))
    logprobs, _ = token_logprobs(model, mb, temperature, chunk_tokens=chunk_tokens)
    mask = mb.mask[0].bool()
    fresh = torch.zeros(len(trajectory.token_ids))
    fresh[1:][mask[:-1]] = logprobs[0, :-1][mask[:-1]].float().cpu()
    diff = float((fresh[1:][mask[:-1]] - mb.sampler_logprobs[0, :-1][mask[:-1]]).abs().sum())
    return fresh.tolist(), diff, int(mask.sum())
