"""Packing trajectories into dense rows for the learner.

Several trajectories share one row; position ids restart at 0 for each, which
transformers turns into a block-diagonal attention mask (no attention across
trajectories). Rows are filled first-fit-decreasing and grouped into
micro-batches under a token budget; the leftover padding is measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from agentgym_core.types import Trajectory


@dataclass
class MicroBatch:
    """Tensors of shape [rows, width]. Position (r, c) predicts `targets[r, c]`."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    ref_logprobs: torch.Tensor
    old_values: torch.Tensor
    constrained_at: list[tuple[int, int]] = field(default_factory=list)
    constrained_ids: list[tuple[int, ...]] = field(default_factory=list)
    real_tokens: int = 0
    placements: list[tuple[int, int, int]] = field(default_factory=list)
    """(index in the packed sequence of trajectories, row, offset) of each trajectory."""

    @property
    def slots(self) -> int:
        """Token slots including padding."""
        return int(self.input_ids.numel())

    @property
    def num_masked(self) -> int:
        """Number of agent tokens that carry loss."""
        return int(self.mask.sum().item())


def _rows_first_fit(lengths: Sequence[int], width: int) -> list[list[int]]:
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    rows: list[list[int]] = []
    free: list[int] = []
    for index in order:
        for r, room in enumerate(free):
            if lengths[index] <= room:
                rows[r].append(index)
                free[r] -= lengths[index]
                break
        else:
            rows.append([index])
            free.append(width - lengths[index])
    return rows


def pack(
    trajectories: Sequence[Trajectory], *, row_tokens: int | None, micro_batch_tokens: int
) -> list[MicroBatch]:
    """Pack trajectories into micro-batches of rows at most `row_tokens` wide.

    A trajectory longer than `row_tokens` gets a row of its own length; None
    makes rows as wide as the longest trajectory.
    """
    lengths = [len(t.token_ids) for t in trajectories] or [1]
    width = max([row_tokens or 0, *lengths])
    rows = _rows_first_fit(lengths, width)
    rows_per_batch = max(1, micro_batch_tokens // width)
    return [
        _build(trajectories, rows[i : i + rows_per_batch], width)
        for i in range(0, len(rows), rows_per_batch)
    ]


def _build(trajectories: Sequence[Trajectory], rows: list[list[int]], width: int) -> MicroBatch:
    used = max(sum(len(trajectories[i].token_ids) for i in row) for row in rows)
    shape = (len(rows), used)
    batch = MicroBatch(
        input_ids=torch.zeros(shape, dtype=torch.long),
        position_ids=torch.zeros(shape, dtype=torch.long),
        targets=torch.zeros(shape, dtype=torch.long),
        mask=torch.zeros(shape),
        old_logprobs=torch.zeros(shape),
        advantages=torch.zeros(shape),
        returns=torch.zeros(shape),
        ref_logprobs=torch.zeros(shape),
        old_values=torch.zeros(shape),
    )
    for r, row in enumerate(rows):
        offset = 0
        for index in row:
            _place(batch, r, offset, trajectories[index])
            batch.placements.append((index, r, offset))
            offset += len(trajectories[index].token_ids)
        batch.position_ids[r, offset:] = torch.arange(used - offset)
        batch.real_tokens += offset
    return batch


def _place(batch: MicroBatch, r: int, offset: int, traj: Trajectory) -> None:
    n = len(traj.token_ids)
    end = offset + n
    batch.input_ids[r, offset:end] = torch.tensor(traj.token_ids)
    batch.position_ids[r, offset:end] = torch.arange(n)
    if n < 2:
        return
    batch.targets[r, offset : end - 1] = torch.tensor(traj.token_ids[1:])
    batch.mask[r, offset : end - 1] = torch.tensor(traj.loss_mask[1:], dtype=torch.float)
    batch.old_logprobs[r, offset : end - 1] = torch.tensor(traj.logprobs[1:])
    if traj.advantages is not None:
        batch.advantages[r, offset : end - 1] = torch.tensor(traj.advantages[1:])
    if traj.returns is not None:
        batch.returns[r, offset : end - 1] = torch.tensor(traj.returns[1:])
    if traj.ref_logprobs is not None:
        batch.ref_logprobs[r, offset : end - 1] = torch.tensor(traj.ref_logprobs[1:])
    if traj.values is not None:
        batch.old_values[r, offset : end - 1] = torch.tensor(traj.values[1:])
    for position, ids in sorted(traj.constraints.items()):
        if position >= 1:
            batch.constrained_at.append((r, offset + position - 1))
            batch.constrained_ids.append(tuple(ids))


def unpack(
    batch: MicroBatch, packed: torch.Tensor, trajectories: Sequence[Trajectory]
) -> dict[int, list[float]]:
    """Per-position values of a packed batch back to per-token lists of its trajectories.

    Token i of a trajectory takes the value at the position that predicts it
    (offset + i - 1) where it is an agent token, and 0 elsewhere: the layout of
    `Trajectory.logprobs`, `ref_logprobs` and `values`. Keys are indices into
    the `trajectories` that were packed.
    """
    values = packed.detach().float().cpu()
    out: dict[int, list[float]] = {}
    for index, r, offset in batch.placements:
        traj = trajectories[index]
        full = torch.zeros(len(traj.token_ids))
        if len(traj.token_ids) > 1:
            mask = torch.tensor(traj.loss_mask[1:], dtype=torch.bool)
            full[1:][mask] = values[r, offset : offset + len(traj.token_ids) - 1][mask]
        out[index] = full.tolist()
    return out
