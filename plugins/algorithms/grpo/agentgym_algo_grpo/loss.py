"""GRPO: Group Relative Policy Optimization.

Paper: DeepSeekMath, https://arxiv.org/abs/2402.03300 (section 4.1). With
`std: none` it is the "Dr. GRPO" variant, https://arxiv.org/abs/2503.20783.

Each task is sampled `group_size` times. A trajectory's advantage is its
outcome reward minus the group mean (divided by the group std unless
disabled), given to every token the agent generated in that episode; the
observation tokens in between carry no loss.
"""

from __future__ import annotations

import torch

from agentgym_algo_grpo.config import GRPOConfig
from agentgym_core.api import (
    AlgorithmNeeds,
    LossInputs,
    TrajectoryBatch,
    clipped_loss_with_kl_and_entropy,
    group_normalize,
)


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
            values = group_normalize(
                [t.reward for t in group], std=self.config.std, eps=self.config.eps
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
