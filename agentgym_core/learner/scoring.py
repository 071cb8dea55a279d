"""Scoring a batch before its advantages: the reference's log-probabilities, the critic's values.

Runs once per update, after the rollout and before `Algorithm.advantages`,
with the learner's weights before the update (the sampler's, unless rollouts
run ahead of the learner); packed like an update, in eval mode as the sampler ran. It writes
`Trajectory.ref_logprobs` and `Trajectory.values`, each once: nothing later
changes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from agentgym_core import distributed
from agentgym_core.learner.critic import last_hidden_state
from agentgym_core.learner.forward import token_logprobs
from agentgym_core.learner.lora import backbone
from agentgym_core.learner.packing import pack, unpack
from agentgym_core.types import Trajectory

if TYPE_CHECKING:
    from agentgym_core.learner.learner import Learner


@torch.no_grad()
def score(learner: Learner, trajectories: Sequence[Trajectory]) -> None:
    """Set `ref_logprobs` (with a reference) and `values` (with a critic) where still None.

    Each rank scores its contiguous share and every rank gets all values (a
    collective when anything is left to score: call it on every rank with the
    same batch).
    """
    todo = [
        t
        for t in trajectories
        if (learner.reference is not None and t.ref_logprobs is None)
        or (learner.critic is not None and t.values is None)
    ]
    if not todo:
        return
    mine = distributed.shard(todo)
    scored = distributed.gather(_score(learner, mine) if mine else [])
    for traj, (ref, values) in zip(todo, scored, strict=True):
        if traj.ref_logprobs is None:
            traj.ref_logprobs = ref
        if traj.values is None:
            traj.values = values


def _score(
    learner: Learner, todo: list[Trajectory]
) -> list[tuple[list[float] | None, list[float] | None]]:
    """(reference log-probs, values) of each trajectory, None where there is no such model."""
    settings = learner.settings
    learner.unwrapped.eval()
    critic = learner.critic.bare if learner.critic is not None else None
    if critic is not None:
        critic.eval()
    batches = pack(
        todo,
        row_tokens=settings.row_tokens,
        share_rows=settings.share_rows,
        share_prompts=settings.share_prompts,
        micro_batch_tokens=settings.micro_batch_tokens,
    )
    ref: dict[int, list[float]] = {}
    values: dict[int, list[float]] = {}
    for mb in batches:
        if learner.reference is not None:
            logprobs, _ = token_logprobs(
                learner.reference,
                mb,
                settings.temperature,
                chunk_tokens=settings.logprob_chunk_tokens,
            )
            ref.update(unpack(mb, logprobs, todo))
        if critic is not None:
            hidden = last_hidden_state(backbone(learner.unwrapped), mb) if critic.shared else None
            values.update(unpack(mb, critic(mb, hidden), todo))
    learner.model.train()
    return [(ref.get(i), values.get(i)) for i in range(len(todo))]
