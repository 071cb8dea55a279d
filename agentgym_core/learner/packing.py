"""Packing trajectories into dense rows for the learner.

Several trajectories share one row; position ids restart at 0 for each, which
transformers turns into a block-diagonal attention mask (no attention across
trajectories). Rows are filled first-fit-decreasing and grouped into
micro-batches under a token budget; the leftover padding is measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
    sampler_logprobs: torch.Tensor
    """The behaviour policy's log-probabilities, as the rollout recorded them."""
    advantages: torch.Tensor
    returns: torch.Tensor
    ref_logprobs: torch.Tensor
    old_values: torch.Tensor
    constrained_at: list[tuple[int, int]] = field(default_factory=list)
    constrained_ids: list[tuple[int, ...]] = field(default_factory=list)
    real_tokens: int = 0
    placements: list[tuple[int, int, int]] = field(default_factory=list)
    """(index in the packed sequence of trajectories, row, offset) of each trajectory."""
    columns: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per-token values packed beside the trajectories' own (`pack(columns=...)`), e.g. an
    off-policy correction's old log-probabilities and weights."""

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
    trajectories: Sequence[Trajectory],
    *,
    row_tokens: int | None,
    micro_batch_tokens: int,
    share_rows: bool = True,
    columns: Mapping[str, Sequence[Sequence[float]]] | None = None,
) -> list[MicroBatch]:
    """Pack trajectories into micro-batches of rows at most `row_tokens` wide.

    A trajectory longer than `row_tokens` gets a row of its own length; None
    makes rows as wide as the longest trajectory. `share_rows=False` gives every
    trajectory a row of its own instead, longest first, each micro-batch as
    wide as its longest row, right-padded with positions that keep counting:
    plain causal attention with no mask, which SDPA runs with its fused
    kernels, where a block-diagonal mask (shared rows) forces the dense path.

    `columns` maps a name to one per-token list per trajectory (the layout of
    `Trajectory.logprobs`); each is packed like the trajectories' own fields into
    `MicroBatch.columns[name]`.
    """
    extra = dict(columns or {})
    clash = set(extra) & {*_LONG, *_SHIFTED}
    if clash:
        raise ValueError(f"columns {sorted(clash)} would shadow the trajectories' own fields")
    lengths = [len(t.token_ids) for t in trajectories] or [1]
    if not share_rows:
        return _one_per_row(trajectories, lengths, micro_batch_tokens, extra)
    width = max([row_tokens or 0, *lengths])
    rows = _rows_first_fit(lengths, width)
    rows_per_batch = max(1, micro_batch_tokens // width)
    return [
        _build(trajectories, rows[i : i + rows_per_batch], extra)
        for i in range(0, len(rows), rows_per_batch)
    ]


def _one_per_row(
    trajectories: Sequence[Trajectory],
    lengths: list[int],
    micro_batch_tokens: int,
    columns: Mapping[str, Sequence[Sequence[float]]],
) -> list[MicroBatch]:
    order = sorted(range(len(trajectories)), key=lambda i: -lengths[i])
    batches, start = [], 0
    while start < len(order):
        count = max(1, micro_batch_tokens // lengths[order[start]])
        rows = [[i] for i in order[start : start + count]]
        batches.append(_build(trajectories, rows, columns, continue_positions=True))
        start += count
    return batches


_SHIFTED = {  # field -> the Trajectory attribute it holds, shifted by one (position c predicts c+1)
    "targets": "token_ids",
    "mask": "loss_mask",
    "sampler_logprobs": "logprobs",
    "advantages": "advantages",
    "returns": "returns",
    "ref_logprobs": "ref_logprobs",
    "old_values": "values",
}
_LONG = ("input_ids", "position_ids", "targets")


def _build(
    trajectories: Sequence[Trajectory],
    rows: list[list[int]],
    columns: Mapping[str, Sequence[Sequence[float]]],
    *,
    continue_positions: bool = False,
) -> MicroBatch:
    """One micro-batch: each field is built as Python rows and becomes one tensor.

    Padding positions restart at 0 (a sequence of their own), or keep counting
    when `continue_positions` (the row then looks like one unpacked sequence).
    """
    used = max(sum(len(trajectories[i].token_ids) for i in row) for row in rows)
    fields: dict[str, list[list[float]]] = {name: [] for name in (*_LONG, *_SHIFTED, *columns)}
    constrained_at: list[tuple[int, int]] = []
    constrained_ids: list[tuple[int, ...]] = []
    placements: list[tuple[int, int, int]] = []
    real = 0
    for r, row in enumerate(rows):
        cells: dict[str, list] = {name: [] for name in fields}
        offset = 0
        for index in row:
            traj = trajectories[index]
            n = len(traj.token_ids)
            cells["input_ids"] += traj.token_ids
            cells["position_ids"] += range(n)
            for name, attribute in _SHIFTED.items():
                values = getattr(traj, attribute)
                cells[name] += [0] * n if values is None else [*values[1:n], 0]
            for name, per_trajectory in columns.items():
                cells[name] += [*per_trajectory[index][1:n], 0]
            for position, ids in sorted(traj.constraints.items()):
                if position >= 1:
                    constrained_at.append((r, offset + position - 1))
                    constrained_ids.append(tuple(ids))
            placements.append((index, r, offset))
            offset += n
        for name, cell in cells.items():
            if name != "position_ids":
                cell += [0] * (used - offset)
            else:
                cell += range(offset, used) if continue_positions else range(used - offset)
            fields[name].append(cell)
        real += offset
    tensors = {
        name: torch.tensor(values, dtype=torch.long if name in _LONG else torch.float32)
        for name, values in fields.items()
    }
    return MicroBatch(
        **{name: tensors.pop(name) for name in dict.fromkeys((*_LONG, *_SHIFTED))},
        columns=tensors,
        constrained_at=constrained_at,
        constrained_ids=constrained_ids,
        real_tokens=real,
        placements=placements,
    )


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
