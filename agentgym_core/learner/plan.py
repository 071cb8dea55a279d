"""How one update's trajectories become optimizer steps and forward passes.

Mini-batches are seeded shuffles of the trainable trajectories (one optimizer
step each, repeated for `epochs`). Under `accelerate launch` each rank packs
its token-balanced share of a mini-batch into micro-batches; ranks with fewer
micro-batches than the busiest add weight-0 passes over the shortest
trajectory, so their collectives pair up.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from agentgym_core import distributed
from agentgym_core.learner.packing import MicroBatch, pack
from agentgym_core.learner.settings import LearnerSettings
from agentgym_core.types import Trajectory


def mini_batches(count: int, parts: int, shuffle: random.Random) -> list[list[int]]:
    """Indices of `count` trajectories dealt into `parts` mini-batches after a seeded shuffle."""
    order = list(range(count))
    shuffle.shuffle(order)
    parts = min(parts, len(order))
    return [order[k::parts] for k in range(parts)]


def micro_batch_plan(
    trajectories: Sequence[Trajectory],
    indices: Sequence[int],
    columns: Mapping[str, Sequence[list[float]]],
    settings: LearnerSettings,
) -> list[tuple[MicroBatch, float]]:
    """This rank's micro-batches of the mini-batch `indices`, each with its loss weight (0 or 1).

    `columns` are per-trajectory values (indexed like `trajectories`) packed beside them.
    """
    chosen = [trajectories[i] for i in indices]
    parts = distributed.split_by_tokens(
        [len(t.token_ids) for t in chosen], distributed.world_size()
    )
    mine = [indices[i] for i in parts[distributed.rank()]]

    def packed(picked: list[int], **shape: object) -> list[MicroBatch]:
        return pack(
            [trajectories[i] for i in picked],
            columns={name: [values[i] for i in picked] for name, values in columns.items()},
            **shape,  # type: ignore[arg-type]
        )

    work = (
        packed(
            mine,
            row_tokens=settings.row_tokens,
            micro_batch_tokens=settings.micro_batch_tokens,
            share_rows=settings.share_rows,
            share_prompts=settings.share_prompts,
        )
        if mine
        else []
    )

    def spare() -> MicroBatch:
        shortest = min(indices, key=lambda i: len(trajectories[i].token_ids))
        length = len(trajectories[shortest].token_ids)
        return packed([shortest], row_tokens=None, micro_batch_tokens=length)[0]

    return distributed.pad_to_busiest(work, spare)
