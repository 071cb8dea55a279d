"""GiGPO: Group-in-Group Policy Optimization for LLM agents.

Paper: Feng et al. 2025, https://arxiv.org/abs/2505.10978 (Eq. 3, 6-8); reference
code: verl-agent, https://github.com/langfengQ/verl-agent (gigpo/core_gigpo.py).

Each task is sampled `group_size` times, as in GRPO, and every turn k of a
trajectory gets A_k = A_episode + omega * A_step(k):

- A_episode: the trajectory's outcome reward normalised within its group (GRPO).
- A_step(k): the group's trajectories often pass through the same environment
  state. Turns taken from the same *anchor state* (the same observation before
  the action, within one task group) form a step group; each turn's discounted
  return from that turn on, r_k + gamma r_{k+1} + ..., is normalised within its
  step group. From one state, the action that led to more reward sooner gets the
  higher advantage. A state met once has no sibling to compare with: A_step = 0.

A_k is given to every token the agent generated in turn k; prompt and
observation tokens carry no loss. The loss is GRPO's clipped surrogate.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import torch

from agentgym_algo_gigpo.config import GiGPOConfig
from agentgym_core.api import (
    AlgorithmNeeds,
    GroupStd,
    LossInputs,
    Trajectory,
    TrajectoryBatch,
    clipped_loss_with_kl_and_entropy,
    group_normalize,
    turn_spans,
)


def discounted_returns(rewards: Sequence[float], gamma: float) -> list[float]:
    """G_k = r_k + gamma * G_{k+1}: each turn's discounted reward from that turn on."""
    out, running = [0.0] * len(rewards), 0.0
    for k in range(len(rewards) - 1, -1, -1):
        running = rewards[k] + gamma * running
        out[k] = running
    return out


def anchor_states(trajectory: Trajectory) -> list[Hashable]:
    """A key for the state before each turn: equal keys are the same state.

    Turn k > 0 acts on the observation turn k - 1 returned, turn 0 on the reset's
    (`first_observation`), so coming back to the starting view later is the same
    state. Trajectories saved without it key turn 0 by the prompt's token ids,
    which hold it (identical for every sample of one task).
    """
    if trajectory.first_observation:
        first: Hashable = ("observation", trajectory.first_observation)
    else:
        first = ("reset", tuple(trajectory.token_ids[: trajectory.prompt_length]))
    return [first, *(("observation", turn.observation) for turn in trajectory.turns[:-1])]


def episode_advantages(
    group: Sequence[Trajectory], *, std: GroupStd, eps: float, stats: str = "trajectory"
) -> list[float]:
    """One advantage per trajectory: its reward normalised within the group.

    Equal rewards, or a trajectory alone, give exactly 0 (no rounding residue from the mean).
    """
    rewards = [t.reward for t in group]
    if len(set(rewards)) < 2:
        return [0.0] * len(group)
    if stats == "trajectory":
        return group_normalize(rewards, std=std, eps=eps)
    # `step`: mean and std over the turns, each trajectory counted once per turn; `** 2`
    # stays (it rounds differently from c * c) so kept runs reproduce bit for bit
    counted = [t.reward for t in group for _ in range(t.num_turns)]
    mean = sum(counted) / len(counted)
    if std == "none":
        return [r - mean for r in rewards]
    divisor = len(counted) - 1 if std == "sample" else len(counted)
    scale = math.sqrt(sum((r - mean) ** 2 for r in counted) / divisor)
    return [(r - mean) / (scale + eps) for r in rewards]


def step_advantages(
    group: Sequence[Trajectory], *, gamma: float, std: GroupStd, eps: float
) -> list[list[float]]:
    """Per trajectory, per turn: the turn's return normalised within its anchor-state group.

    `group` is one task's samples, so states are never matched across tasks.
    """
    returns = [discounted_returns([turn.reward for turn in t.turns], gamma) for t in group]
    members: dict[Hashable, list[tuple[int, int]]] = {}
    for i, trajectory in enumerate(group):
        for k, state in enumerate(anchor_states(trajectory)):
            members.setdefault(state, []).append((i, k))
    out = [[0.0] * len(r) for r in returns]
    for cells in members.values():
        values = [returns[i][k] for i, k in cells]
        if len(set(values)) < 2:
            continue  # met once, or equal returns: exactly 0, no rounding residue
        for (i, k), value in zip(cells, group_normalize(values, std=std, eps=eps), strict=True):
            out[i][k] = value
    return out


def _per_token(trajectory: Trajectory, per_turn: Sequence[float]) -> list[float]:
    out = [0.0] * len(trajectory.token_ids)
    for (start, end), value in zip(turn_spans(trajectory), per_turn, strict=True):
        out[start:end] = [value] * (end - start)
    return out


class GiGPO:
    """The `gigpo` algorithm."""

    def __init__(self, config: GiGPOConfig) -> None:
        self.config = config
        self.needs = AlgorithmNeeds(
            online=True,
            reference=config.kl_coef > 0,
            group_size=config.min_group_size,
            entropy_grad=config.entropy_coef > 0,
        )

    def turn_advantages(self, group: Sequence[Trajectory]) -> list[list[float]]:
        """A_episode + omega * A_step for each turn of each trajectory of one group."""
        c = self.config
        episode = episode_advantages(group, std=c.std, eps=c.eps, stats=c.episode_stats)
        step = step_advantages(group, gamma=c.gamma, std=c.std, eps=c.eps)
        return [[e + c.omega * s for s in steps] for e, steps in zip(episode, step, strict=True)]

    def advantages(self, batch: TrajectoryBatch) -> None:
        """Set per-token advantages: each turn's combined advantage on that turn's tokens."""
        for group in batch.groups().values():
            per_turn = self.turn_advantages(group)
            if self.config.drop_uniform_groups and not any(a for turns in per_turn for a in turns):
                continue  # advantages stay None: the learner skips these trajectories
            for trajectory, values in zip(group, per_turn, strict=True):
                trajectory.advantages = _per_token(trajectory, values)

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped policy loss + kl_coef * KL(ref) - entropy_coef * entropy, token mean."""
        return clipped_loss_with_kl_and_entropy(
            inputs,
            clip_low=self.config.clip_eps,
            clip_high=self.config.clip_eps_high,
            kl_coef=self.config.kl_coef,
            entropy_coef=self.config.entropy_coef,
        )
