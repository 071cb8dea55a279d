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

from agentgym_core import distributed
from agentgym_core.interfaces import OfflineAlgorithm, SequenceInputs
from agentgym_core.learner.forward import token_logprobs
from agentgym_core.learner.learner import Learner
from agentgym_core.learner.packing import pack
from agentgym_core.types import Trajectory

Example = tuple[Trajectory, ...]


def sequence_logprobs(
    model: Any,
    sequences: Sequence[Trajectory],
    temperature: float = 1.0,
    *,
    share_rows: bool = True,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's log-probability summed over its agent tokens, and their count.

    The sequences are packed into one micro-batch (several per row, no
    attention across them); `placements` maps each back to its row and offset.
    Returns two [len(sequences)] tensors; the first carries gradient when the
    model does. `chunk_tokens`: as `forward.policy_forward`'s.
    """
    (batch,) = pack(
        sequences, row_tokens=None, micro_batch_tokens=sys.maxsize, share_rows=share_rows
    )
    logprobs, _ = token_logprobs(model, batch, temperature, chunk_tokens=chunk_tokens)
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


def micro_batches(
    examples: Sequence[Example], token_budget: int, *, padded: bool = False
) -> list[list[Example]]:
    """Whole examples grouped under `token_budget` tokens (at least one per group).

    Shared rows: consecutive examples, counted by their tokens. `padded` (one row
    per sequence, each as wide as the group's longest): longest first, counted
    with their padding, so each group pads only to a width near its own.
    """
    if padded:
        return _padded_groups(examples, token_budget)
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


def _padded_groups(examples: Sequence[Example], token_budget: int) -> list[list[Example]]:
    def longest(example: Example) -> int:
        return max(len(s.token_ids) for s in example)

    groups: list[list[Example]] = []
    rows = width = 0
    for example in sorted(examples, key=longest, reverse=True):
        if groups and (rows + len(example)) * width <= token_budget:
            groups[-1].append(example)
            rows += len(example)
        else:
            groups.append([example])
            rows, width = len(example), longest(example)
    return groups


def sequence_update(
    learner: Learner,
    algorithm: OfflineAlgorithm,
    examples: Sequence[Example],
    *,
    micro_batch_tokens: int,
    temperature: float = 1.0,
    share_rows: bool = True,
) -> dict[str, float]:
    """One optimizer step on `examples`; returns the loss and example-weighted metrics.

    `share_rows`: several sequences per packed row (else one per row, padded).

    Under `accelerate launch` each rank takes a token-balanced share of the
    examples; totals are those of all examples and the loss is scaled by the
    world size, so the gradient DDP averages is the single-process one.
    """
    start = time.perf_counter()
    learner.model.train()
    total_tokens = float(sum(sum(s.loss_mask[1:]) for ex in examples for s in ex)) or 1.0
    sizes = [sum(len(s.token_ids) for s in example) for example in examples]
    mine = [
        examples[i] for i in distributed.split_by_tokens(sizes, learner.world)[distributed.rank()]
    ]
    groups = micro_batches(mine, micro_batch_tokens, padded=not share_rows)
    plan = distributed.pad_to_busiest(groups, lambda: [examples[sizes.index(min(sizes))]])
    sums: dict[str, float] = defaultdict(float)
    for index, (group, weight) in enumerate(plan):
        with learner.gradient_sync(index == len(plan) - 1):
            loss, metrics = _group_loss(
                learner, algorithm, group, (total_tokens, len(examples)), temperature, share_rows
            )
            scale = weight * learner.world  # DDP averages over ranks: this makes it a sum
            learner.accelerator.backward(loss if scale == 1.0 else loss * scale)
        if weight == 0:
            continue  # a stand-in that only pairs this rank's collectives with the others'
        sums["loss"] += float(loss.detach())
        share = len(group) / len(examples)
        for key, value in metrics.items():
            sums[key] += value * share
    sums = defaultdict(float, distributed.sum_over_ranks(sums))
    sums["grad_norm"] = learner.apply_gradients()
    sums["lr"] = learner.scheduler.get_last_lr()[0]
    learner.scheduler.step()
    learner.finish_update()
    sums["tokens"] = total_tokens
    sums["update_seconds"] = time.perf_counter() - start
    return dict(sums)


def _group_loss(
    learner: Learner,
    algorithm: OfflineAlgorithm,
    group: list[Example],
    totals: tuple[float, int],
    temperature: float,
    share_rows: bool,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The algorithm's loss on one micro-batch; `totals`: agent tokens and examples of the step."""
    total_tokens, total_examples = totals
    per_example = algorithm.sequences_per_example
    flat = [seq for example in group for seq in example]
    shape = {"share_rows": share_rows, "chunk_tokens": learner.settings.logprob_chunk_tokens}
    logprobs, tokens = sequence_logprobs(learner.model, flat, temperature, **shape)
    reference = None
    if learner.reference is not None:
        with torch.no_grad():
            reference, _ = sequence_logprobs(learner.reference, flat, temperature, **shape)
        reference = reference.view(-1, per_example)
    inputs = SequenceInputs(
        logprobs=logprobs.view(-1, per_example),
        tokens=tokens.view(-1, per_example),
        total_examples=total_examples,
        total_tokens=total_tokens,
        ref_logprobs=reference,
    )
    return algorithm.sequence_loss(inputs)
