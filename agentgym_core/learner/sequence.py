"""Whole-sequence log-probabilities and one optimizer step for offline algorithms (SFT, DPO).

DPO compares summed log-probabilities of whole sequences, so an example
(chosen and rejected) must stay within one micro-batch and each packed
segment must map back to its sequence. The online learner's packer and
`token_logprobs` do the rest (dense rows, constrained positions included).
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from agentgym_core.interfaces import OfflineAlgorithm, SequenceInputs
from agentgym_core.learner.learner import Learner, token_logprobs
from agentgym_core.learner.packing import pack
from agentgym_core.types import Trajectory

Example = tuple[Trajectory, ...]


def sequence_logprobs(
    model: Any, sequences: Sequence[Trajectory], temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's log-probability summed over its agent tokens, and their count.

    The sequences are packed into one micro-batch (several per row, no
    attention across them); `placements` maps each back to its row and offset.
    Returns two [len(sequences)] tensors; the first carries gradient when the
    model does.
    """
    (batch,) = pack(sequences, row_tokens=None, micro_batch_tokens=sys.maxsize)
    logprobs, _ = token_logprobs(model, batch, temperature)
    owner = torch.full(batch.mask.shape, len(sequences), dtype=torch.long)
    for index, row, offset in batch.placements:
        owner[row, offset : offset + len(sequences[index].token_ids) - 1] = index
    device = logprobs.device
    owner, mask = owner.to(device).flatten(), batch.mask.to(device).flatten()
    sums = torch.zeros(len(sequences) + 1, device=device).index_add(
        0, owner, logprobs.flatten() * mask
    )
    counts = torch.zeros(len(sequences) + 1, device=device).index_add(0, owner, mask)
    return sums[:-1], counts[:-1]


def micro_batches(examples: Sequence[Example], token_budget: int) -> list[list[Example]]:
    """Consecutive whole examples grouped under `token_budget` tokens (at least one per group)."""
    groups: list[list[Example]] = []
    current: list[Example] = []
    tokens = 0
    for example in examples:
        size = sum(len(s.token_ids) for s in example)
        if current and tokens + size > token_budget:
            groups.append(current)
            current, tokens = [], 0
        current.append(example)
        tokens += size
    if current:
        groups.append(current)
    return groups


def sequence_update(
    learner: Learner,
    algorithm: OfflineAlgorithm,
    examples: Sequence[Example],
    *,
    micro_batch_tokens: int,
    temperature: float = 1.0,
) -> dict[str, float]:
    """One optimizer step on `examples`; returns the loss and example-weighted metrics."""
    start = time.perf_counter()
    learner.model.train()
    per_example = algorithm.sequences_per_example
    total_tokens = float(sum(sum(s.loss_mask[1:]) for ex in examples for s in ex)) or 1.0
    sums: dict[str, float] = defaultdict(float)
    for group in micro_batches(examples, micro_batch_tokens):
        flat = [seq for example in group for seq in example]
        logprobs, tokens = sequence_logprobs(learner.model, flat, temperature)
        reference = None
        if learner.reference is not None:
            with torch.no_grad():
                reference, _ = sequence_logprobs(learner.reference, flat, temperature)
            reference = reference.view(-1, per_example)
        inputs = SequenceInputs(
            logprobs=logprobs.view(-1, per_example),
            tokens=tokens.view(-1, per_example),
            total_examples=len(examples),
            total_tokens=total_tokens,
            ref_logprobs=reference,
        )
        loss, metrics = algorithm.sequence_loss(inputs)
        learner.accelerator.backward(loss)
        sums["loss"] += float(loss.detach())
        share = len(group) / len(examples)
        for key, value in metrics.items():
            sums[key] += value * share
    sums["grad_norm"] = _clip(learner)
    learner.optimizer.step()
    learner.optimizer.zero_grad(set_to_none=True)
    sums["lr"] = learner.scheduler.get_last_lr()[0]
    learner.scheduler.step()
    sums["tokens"] = total_tokens
    sums["update_seconds"] = time.perf_counter() - start
    return dict(sums)


def _clip(learner: Learner) -> float:
    """Clip gradients to the learner's `max_grad_norm`; returns the norm before clipping."""
    parameters = [p for p in learner.model.parameters() if p.grad is not None]
    if not parameters:
        return 0.0
    limit = learner.settings.max_grad_norm
    if limit is None:
        return float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in parameters])))
    return float(learner.accelerator.clip_grad_norm_(parameters, limit))
