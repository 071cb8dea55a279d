"""The output head's per-token numbers: log-probability of the target and entropy.

`scores` turns float32 logits into both. `scores_in_chunks` runs the output
head itself on a few agent tokens at a time (`trainer.logprob_chunk_tokens`):
with a large vocabulary (Qwen2.5's 151,936 ids) the [agent tokens, vocab]
float32 logits of a micro-batch, and the several tensors that size autograd
keeps for the backward pass, are gigabytes. Each chunk runs under activation
checkpointing, so its backward computes the chunk's logits again instead of
keeping them: memory follows the chunk, not the micro-batch, for one more
head matmul on the agent tokens. The values are the plain path's up to float
rounding (the matmul's blocking differs with its row count).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from agentgym_core.modeling.text_config import text_config
from agentgym_core.policies.constraints import allowed_mask

Constraints = Sequence[tuple[int, Sequence[int]]]
"""(agent-token index, the ids the sampler allowed there) of constrained agent tokens."""

LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")
"""Config fields of models whose forward changes the logits after the head (Gemma 2, Cohere,
Granite): the head alone would not give their logits."""


def scores(
    logits: torch.Tensor, targets: torch.Tensor, *, entropy_grad: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-probability of the target and the entropy of each row of float32 `logits`.

    -inf logits (ids the sampler could not pick) add nothing to the entropy.
    `entropy_grad=False`: the entropy is a metric only, outside the autograd graph.
    """
    logp = torch.log_softmax(logits, dim=-1)
    chosen = logp.gather(1, targets.unsqueeze(1)).squeeze(1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        finite = logp.masked_fill(~torch.isfinite(logp), 0.0)
        entropy = -(logp.exp() * finite).sum(-1)
    return chosen, entropy


def block(logits: torch.Tensor, constraints: Constraints) -> torch.Tensor:
    """-inf outside the allowed ids on the constrained rows of `logits` [tokens, vocab]."""
    if not constraints:
        return logits
    rows = [row for row, _ in constraints]
    allowed = [ids for _, ids in constraints]
    blocked = allowed_mask(rows, allowed, tuple(logits.shape), logits.device)
    return logits.masked_fill(blocked, float("-inf"))


def scores_in_chunks(
    head: torch.nn.Module,
    states: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    chunk: int,
    constraints: Constraints = (),
    *,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`scores` of `head(states) / temperature`, `chunk` rows of `states` at a time.

    The head's own `forward` runs (a LoRA-wrapped head, a bias, tied weights
    and autocast act as in the model's call), not its hooks: those ran in the
    model's call, where the rows were recorded (`head_inputs`). FSDP2's, run
    once per chunk, would reduce the head's gradient and free its gathered
    weight after the first chunk's backward pass, while the next still needs it.
    """
    chosen, entropy = [], []
    of_chunk: dict[int, list[tuple[int, Sequence[int]]]] = {}
    for row, ids in constraints:
        of_chunk.setdefault(row // chunk, []).append((row % chunk, ids))
    # one split, not a slice per chunk: its backward joins the chunks' gradients once
    for index, (part_states, part_targets) in enumerate(
        zip(states.split(chunk), targets.split(chunk), strict=True)
    ):
        args = (head, part_states, part_targets, temperature, of_chunk.get(index, []), entropy_grad)
        if torch.is_grad_enabled():
            part = checkpoint(_chunk_scores, *args, use_reentrant=False)
        else:
            part = _chunk_scores(*args)
        chosen.append(part[0])
        entropy.append(part[1])
    return torch.cat(chosen), torch.cat(entropy)


def _chunk_scores(
    head: torch.nn.Module,
    states: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    constraints: Constraints,
    entropy_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = block(head.forward(states).float() / temperature, constraints)
    return scores(logits, targets, entropy_grad=entropy_grad)


def output_head(model: Any) -> torch.nn.Module:
    """The output head of a transformers causal LM whose logits are the head's output alone."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None:
        raise ValueError(
            f"trainer.logprob_chunk_tokens: {type(model).__name__} has no output head "
            "(get_output_embeddings): leave logprob_chunk_tokens null for it"
        )
    config = text_config(model)
    changed = [name for name in LOGIT_TRANSFORMS if getattr(config, name, None) is not None]
    if changed:
        raise ValueError(
            f"trainer.logprob_chunk_tokens: this model changes its logits after the output "
            f"head ({', '.join(changed)} in its config), which the chunks would miss: "
            "leave logprob_chunk_tokens null for it"
        )
    return head


@contextlib.contextmanager
def head_inputs(head: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """While open, the output head records its input and computes nothing.

    The list it yields holds the hidden states the head was called on: the
    model's forward still runs through its wrappers (DDP, FSDP, PEFT) and hands
    the head exactly what it would project, and the [.., vocab] logits are
    never made (the head gets an empty slice of its input).
    """
    seen: list[torch.Tensor] = []

    def record(module: Any, args: tuple) -> tuple:
        seen.append(args[0])
        return (args[0][..., :0, :], *args[1:])

    handle = head.register_forward_pre_hook(record)
    try:
        yield seen
    finally:
        handle.remove()
