"""GRPO: Group Relative Policy Optimization.

Paper: DeepSeekMath, https://arxiv.org/abs/2402.03300 (section 4.1). With
`scale_by_std: false` it is the "Dr. GRPO" variant, https://arxiv.org/abs/2503.20783.

Each task is sampled `group_size` times. A trajectory's advantage is its
outcome reward minus the group mean (divided by the group std unless
disabled), given to every token the agent generated in that episode; the
observation tokens in between carry no loss.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from agentgym_core.api import (
    AlgorithmNeeds,
    ClippedLossOptions,
    LossInputs,
    TrajectoryBatch,
    clipped_loss_with_kl_and_entropy,
)


class GRPOConfig(ClippedLossOptions):
    """Options of `grpo`."""

    kl_coef: float = Field(
        0.0, ge=0, description="Weight of the k3 KL to the frozen reference; 0 drops the reference."
    )
    scale_by_std: bool = Field(
        True, description="Divide by the group's reward std (GRPO); false: Dr. GRPO."
    )
    eps: float = Field(1e-6, gt=0, description="Added to the std before dividing.")
    min_group_size: int = Field(2, ge=2, description="Group size the trainer must provide.")
    drop_uniform_groups: bool = Field(
        False,
        description="Leave out groups whose rewards are all equal (zero advantage), as DAPO's "
        "dynamic sampling does: they only dilute the token mean and cost learner time.",
    )


def group_advantages(rewards: list[float], *, scale_by_std: bool, eps: float) -> list[float]:
    """(r - mean) / (std + eps) within one group; population std, as in the paper's code."""
    mean = sum(rewards) / len(rewards)
    centered = [r - mean for r in rewards]
    if not scale_by_std:
        return centered
    std = math.sqrt(sum(c * c for c in centered) / len(rewards))
    return [c / (std + eps) for c in centered]


class GRPO:
    """The `grpo` algorithm."""

    def __init__(self, config: GRPOConfig) -> None:
        self.config = config
        self.needs = AlgorithmNeeds(
            online=True,
            reference=config.kl_coef > 0,
            group_size=config.min_group_size,
            entropy_grad=config.entropy_coef > 0,
        )

    def advantages(self, batch: TrajectoryBatch) -> None:
        """Set per-token advantages: the trajectory's group advantage on every agent token."""
        for group in batch.groups().values():
            if self.config.drop_uniform_groups and len({t.reward for t in group}) == 1:
                continue  # advantages stay None: the learner skips these trajectories
            values = group_advantages(
                [t.reward for t in group],
                scale_by_std=self.config.scale_by_std,
                eps=self.config.eps,
            )
            for trajectory, advantage in zip(group, values, strict=True):
                trajectory.advantages = [advantage * m for m in trajectory.loss_mask]

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped policy loss + kl_coef * KL(ref) - entropy_coef * entropy, token mean."""
        return clipped_loss_with_kl_and_entropy(
            inputs,
            clip_low=self.config.clip_eps,
            clip_high=self.config.clip_eps_high,
            kl_coef=self.config.kl_coef,
            entropy_coef=self.config.entropy_coef,
        )
