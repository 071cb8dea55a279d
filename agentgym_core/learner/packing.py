"""Packing trajectories into dense rows for the learner.

Several trajectories share one row; position ids restart at 0 for each, which
transformers turns into a block-diagonal attention mask (no attention across
trajectories). Rows are filled first-fit-decreasing and grouped into
micro-batches under a token budget; the leftover padding is measured.

With one trajectory per row, trajectories that begin with the same prompt (a
GRPO group's first turn) can share it (`share_prompts`): the micro-batch holds
each prompt once (`Prefixes`) and each row only its trajectory's tokens after
it. The forward pass computes the prompts' keys and values once and each row
attends to its own prompt's (`forward.run_model`), so a group of 8 computes its
prompt once instead of 8 times, with the same log-probabilities.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from agentgym_core.policies.prefix_cache import shared_rows
from agentgym_core.types import Trajectory


@dataclass
class Prefixes:
    """Prompts shared by a micro-batch's rows: each computed once, attended to by its rows."""

    input_ids: torch.Tensor
    """[prompts, width], right-padded; positions are 0, 1, ... in every prompt."""
    lengths: torch.Tensor
    """[prompts] the real tokens of each."""
    of_row: torch.Tensor
    """[rows] the prompt each row continues."""

    def key_mask(self, width: int) -> torch.Tensor:
        """[rows, prompt width + width]: 1 on each row's own prompt tokens and its own columns."""
        prompt = torch.arange(self.input_ids.shape[1]) < self.lengths[self.of_row].unsqueeze(1)
        return torch.cat([prompt.long(), torch.ones(len(self.of_row), width, dtype=torch.long)], 1)


@dataclass
class MicroBatch:
    """Tensors of shape [rows, width]. Position (r, c) predicts `targets[r, c]`."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    sampler_logprobs: torch.Tensor
    """The sampler's log-probabilities, as the rollout recorded them."""
    behaviour_logprobs: torch.Tensor
    """The behaviour policy's (`Trajectory.behaviour`): recomputed ones where the trainer
    recomputed them, else the sampler's."""
    advantages: torch.Tensor
    returns: torch.Tensor
    ref_logprobs: torch.Tensor
    old_values: torch.Tensor
    constrained_at: list[tuple[int, int]] = field(default_factory=list)
    constrained_ids: list[tuple[int, ...]] = field(default_factory=list)
    real_tokens: int = 0
    placements: list[tuple[int, int, int]] = field(default_factory=list)
    """(index in the packed sequence of trajectories, row, offset) of each trajectory: token i
    sits at column offset + i. With a shared prompt the offset is negative: the row holds the
    trajectory's tokens from the prompt's end on, the only ones that carry loss."""
    columns: dict[str, torch.Tensor] = field(default_factory=dict)
    """Per-token values packed beside the trajectories' own (`pack(columns=...)`), e.g. an
    off-policy correction's old log-probabilities and weights."""
    prefixes: Prefixes | None = None
    """Shared prompts the rows continue (`share_prompts`); None: each row starts at token 0."""

    @property
    def slots(self) -> int:
        """Token slots including padding (shared prompts' included)."""
        shared = 0 if self.prefixes is None else self.prefixes.input_ids.numel()
        return int(self.input_ids.numel()) + shared

    @property
    def num_masked(self) -> int:
        """Number of agent tokens that carry loss."""
        return int(self.mask.sum().item())


def prompt_groups(trajectories: Sequence[Trajectory]) -> list[tuple[list[int], int]]:
    """Trajectories grouped by prompt (every token before the first agent token).

    Each group comes with the tokens it shares: all of its prompt but the last
    token, which stays in each row to predict that row's first agent token. A
    lone trajectory shares nothing.
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, traj in enumerate(trajectories):
        first = next((i for i, m in enumerate(traj.loss_mask) if m), len(traj.token_ids))
        groups.setdefault(tuple(traj.token_ids[:first]), []).append(index)
    return [
        (members, max(len(prompt) - 1, 0) if len(members) > 1 else 0)
        for prompt, members in groups.items()
    ]


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
    share_prompts: bool = False,
    columns: Mapping[str, Sequence[Sequence[float]]] | None = None,
) -> list[MicroBatch]:
    """Pack trajectories into micro-batches of rows at most `row_tokens` wide.

    A trajectory longer than `row_tokens` gets a row of its own length; None
    makes rows as wide as the longest trajectory. `share_rows=False` gives every
    trajectory a row of its own instead, longest first, each micro-batch as
    wide as its longest row, right-padded with positions that keep counting:
    plain causal attention with no mask, which SDPA runs with its fused
    kernels, where a block-diagonal mask (shared rows) forces the dense path.
    `share_prompts` (one per row only) lays out each prompt a micro-batch's
    rows begin with once (`Prefixes`), where that saves enough tokens.

    `columns` maps a name to one per-token list per trajectory (the layout of
    `Trajectory.logprobs`); each is packed like the trajectories' own fields into
    `MicroBatch.columns[name]`.
    """
    extra = dict(columns or {})
    clash = set(extra) & {*_LONG, *_SHIFTED}
    if clash:
        raise ValueError(f"columns {sorted(clash)} would shadow the trajectories' own fields")
    lengths = [len(t.token_ids) for t in trajectories] or [1]
    if share_prompts and share_rows:
        raise ValueError("share_prompts needs one trajectory per row (share_rows=False)")
    if share_prompts:
        return _prompt_rows(trajectories, micro_batch_tokens, extra)
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
    indices: Sequence[int] | None = None,
) -> list[MicroBatch]:
    """Whole trajectories (`indices` of them; None: all), one per row, longest first."""
    chosen = range(len(trajectories)) if indices is None else indices
    order = sorted(chosen, key=lambda i: -lengths[i])
    batches, start = [], 0
    while start < len(order):
        count = max(1, micro_batch_tokens // lengths[order[start]])
        rows = [[i] for i in order[start : start + count]]
        batches.append(_build(trajectories, rows, columns, continue_positions=True))
        start += count
    return batches


SHARED_PROMPT_MIN_SAVING = 0.25
"""A micro-batch lays its prompts out once only where that saves at least this share of its
tokens: its rows then attend under an explicit key mask, slower per token than plain
causal attention's fused kernel, so long multi-turn rows that would share little keep
their whole prompts."""


def _prompt_rows(
    trajectories: Sequence[Trajectory],
    micro_batch_tokens: int,
    columns: Mapping[str, Sequence[Sequence[float]]],
) -> list[MicroBatch]:
    """One row per trajectory after its group's shared prompt, longest row first.

    A micro-batch takes rows while its padded rows plus the prompts of the groups
    it holds stay within the token budget.
    """
    starts = {i: shared for members, shared in prompt_groups(trajectories) for i in members}
    prompt_of = {i: tuple(t.token_ids[: starts[i]]) for i, t in enumerate(trajectories)}
    lengths = [len(t.token_ids) for t in trajectories]
    tails = {i: lengths[i] - starts[i] for i in starts}
    batches: list[list[int]] = []
    current: list[int] = []
    prompts: dict[tuple[int, ...], int] = {}
    for index in sorted(tails, key=lambda i: -tails[i]):
        prompt = prompt_of[index]
        added = 0 if prompt in prompts else len(prompt)
        rows = len(current) + 1
        cost = rows * tails[current[0]] + sum(prompts.values()) + added if current else 0
        if cost > micro_batch_tokens:
            batches.append(current)
            current, prompts = [], {}
        current.append(index)
        prompts[prompt] = len(prompt)
    if current:
        batches.append(current)
    packed: list[MicroBatch] = []
    for rows in batches:
        if _worth_sharing(rows, lengths, tails, prompt_of):
            packed.append(
                _build(
                    trajectories,
                    [[i] for i in rows],
                    columns,
                    continue_positions=True,
                    starts={i: starts[i] for i in rows},
                )
            )
        else:  # whole rows are wider: split again under the budget counted for them
            packed += _one_per_row(trajectories, lengths, micro_batch_tokens, columns, rows)
    return packed


def _worth_sharing(
    rows: list[int],
    lengths: Sequence[int],
    tails: Mapping[int, int],
    prompt_of: Mapping[int, tuple[int, ...]],
) -> bool:
    """Whether laying the rows' prompts out once saves enough of their tokens."""
    whole = len(rows) * max(lengths[i] for i in rows)
    shared = len(rows) * max(tails[i] for i in rows)
    shared += sum(len(prompt) for prompt in {prompt_of[i] for i in rows})
    return shared <= (1 - SHARED_PROMPT_MIN_SAVING) * whole


_SHIFTED = {  # field -> the Trajectory attribute it holds, shifted by one (position c predicts c+1)
    "targets": "token_ids",
    "mask": "loss_mask",
    "sampler_logprobs": "logprobs",
    "behaviour_logprobs": "behaviour",
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
    starts: Mapping[int, int] | None = None,
) -> MicroBatch:
    """One micro-batch: each field is built as Python rows and becomes one tensor.

    Padding positions restart at 0 (a sequence of their own), or keep counting
    when `continue_positions` (the row then looks like one unpacked sequence).
    `starts` (one trajectory per row): where each row begins, its tokens before
    that laid out once in the batch's `prefixes`.
    """
    starts = starts or {}
    used = max(sum(len(trajectories[i].token_ids) - starts.get(i, 0) for i in row) for row in rows)
    fields: dict[str, list[list[float]]] = {name: [] for name in (*_LONG, *_SHIFTED, *columns)}
    constrained_at: list[tuple[int, int]] = []
    constrained_ids: list[tuple[int, ...]] = []
    placements: list[tuple[int, int, int]] = []
    real = 0
    for r, row in enumerate(rows):
        cells: dict[str, list] = {name: [] for name in fields}
        offset = 0
        position = 0
        for index in row:
            traj = trajectories[index]
            n, start = len(traj.token_ids), starts.get(index, 0)
            cells["input_ids"] += traj.token_ids[start:]
            cells["position_ids"] += range(start, n)
            for name, attribute in _SHIFTED.items():
                values = getattr(traj, attribute)
                cells[name] += [0] * (n - start) if values is None else _next(values, start, n)
            for name, per_trajectory in columns.items():
                cells[name] += _next(per_trajectory[index], start, n)
            for at, ids in sorted(traj.constraints.items()):
                if at - 1 >= start:  # predicted in this row (a shared prompt holds no agent token)
                    constrained_at.append((r, offset - start + at - 1))
                    constrained_ids.append(tuple(ids))
            placements.append((index, r, offset - start))
            offset += n - start
            position = n
        for name, cell in cells.items():
            if name != "position_ids":
                cell += [0] * (used - offset)
            elif continue_positions:
                cell += range(position, position + used - offset)
            else:
                cell += range(used - offset)
            fields[name].append(cell)
        real += offset
    prefixes = _prefixes(trajectories, [row[0] for row in rows], starts) if starts else None
    tensors = {
        name: torch.tensor(values, dtype=torch.long if name in _LONG else torch.float32)
        for name, values in fields.items()
    }
    return MicroBatch(
        **{name: tensors.pop(name) for name in dict.fromkeys((*_LONG, *_SHIFTED))},
        columns=tensors,
        constrained_at=constrained_at,
        constrained_ids=constrained_ids,
        real_tokens=real + (0 if prefixes is None else int(prefixes.lengths.sum())),
        placements=placements,
        prefixes=prefixes,
    )


def _next(values: Sequence[float], start: int, stop: int) -> list[float]:
    """What columns start..stop-1 predict: values[start + 1 : stop + 1], 0 past the end."""
    picked = list(values[start + 1 : stop + 1])
    return picked + [0] * (stop - start - len(picked))


def _prefixes(
    trajectories: Sequence[Trajectory], rows: list[int], starts: Mapping[int, int]
) -> Prefixes | None:
    """Each distinct prompt of the rows once (rows that share none get an empty one)."""
    row_prompts = [trajectories[i].token_ids[: starts.get(i, 0)] for i in rows]
    of_row, firsts = shared_rows(row_prompts, [None] * len(rows))
    prompts = [row_prompts[first] for first in firsts]
    if not any(prompts):
        return None
    width = max(len(prompt) for prompt in prompts)
    return Prefixes(
        input_ids=torch.tensor([[*p, *[0] * (width - len(p))] for p in prompts], dtype=torch.long),
        lengths=torch.tensor([len(p) for p in prompts], dtype=torch.long),
        of_row=torch.tensor(of_row, dtype=torch.long),
    )


def unpack(
    batch: MicroBatch, packed: torch.Tensor, trajectories: Sequence[Trajectory]
) -> dict[int, list[float]]:
    """Per-position values of a packed batch back to per-token lists of its trajectories.

    Token i of a trajectory takes the value at the position that predicts it
    (offset + i - 1) where it is an agent token, and 0 elsewhere: the layout of
    `Trajectory.logprobs`, `ref_logprobs` and `values`. Keys are indices into
    the `trajectories` that were packed. (A shared prompt holds no agent token,
    so every agent token is in its trajectory's row.)
    """
    values = packed.detach().float().cpu()
    out: dict[int, list[float]] = {}
    for index, r, offset in batch.placements:
        traj = trajectories[index]
        full = torch.zeros(len(traj.token_ids))
        agent = torch.tensor(traj.loss_mask).nonzero().squeeze(1)
        agent = agent[agent >= 1]  # token 0 has no position predicting it
        full[agent] = values[r, offset + agent - 1]
        out[index] = full.tolist()
    return out
