"""RLOO: REINFORCE with a leave-one-out baseline.

Paper: Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization
for Learning from Human Feedback in LLMs", https://arxiv.org/abs/2402.14740
(the estimator is Kool et al.'s, https://openreview.net/forum?id=r1lgTGL5DE).

Each task is sampled k times. A trajectory's advantage is its reward minus the
mean reward of the other k - 1 samples of its task, given to every token the
agent generated in the episode; observation tokens carry no loss. With
`kl_coef`, the reward first loses kl_coef times the episode's KL to the frozen
reference, summed over the agent's tokens (the paper's sequence-level penalty).
The loss is PPO's clipped surrogate: with one optimizer step per batch the
ratio is 1 and it is exactly the REINFORCE gradient.
"""

from __future__ import annotations

import torch

from agentgym_algo_rloo.config import RLOOConfig
from agentgym_core.api import (
    AlgorithmNeeds,
    LossInputs,
    Trajectory,
    TrajectoryBatch,
    agent_positions,
    clipped_loss_with_kl_and_entropy,
)


def leave_one_out(rewards: list[float]) -> list[float]:
    """r_i - mean_{j != i} r_j for each sample of one group (k >= 2)."""
    k, total = len(rewards), sum(rewards)
    return [r - (total - r) / (k - 1) for r in rewards]


def penalized_reward(trajectory: Trajectory, kl_coef: float) -> float:
    """The outcome reward minus kl_coef * sum over agent tokens of (logp - ref_logp)."""
    if not kl_coef:
        return trajectory.reward
    if trajectory.ref_logprobs is None:
        raise ValueError("rloo with kl_coef > 0 needs Trajectory.ref_logprobs")
    kl = sum(
        trajectory.behaviour[i] - trajectory.ref_logprobs[i] for i in agent_positions(trajectory)
    )
    return trajectory.reward - kl_coef * kl


class RLOO:
    """The `rloo` algorithm."""

    def __init__(self, config: RLOOConfig) -> None:
        self.config = config
        self.needs = AlgorithmNeeds(
            online=True,
            reference=config.kl_coef > 0,
            group_size=config.min_group_size,
            entropy_grad=config.entropy_coef > 0,
        )

    def advantages(self, batch: TrajectoryBatch) -> None:
        """The leave-one-out advantage on every agent token of each trajectory.

        A group left with one trainable trajectory (its siblings hit env errors)
        has no baseline: its advantages stay None and the learner skips it.
        """
        for group in batch.groups().values():
            if len(group) < 2:
                continue
            rewards = [penalized_reward(t, self.config.kl_coef) for t in group]
            for trajectory, advantage in zip(group, leave_one_out(rewards), strict=True):
                trajectory.advantages = [advantage * m for m in trajectory.loss_mask]

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped policy loss - entropy_coef * entropy, token mean."""
        loss, metrics = clipped_loss_with_kl_and_entropy(
            inputs,
            clip_low=self.config.clip_eps,
            clip_high=self.config.clip_eps_high,
            kl_coef=0.0,  # the KL penalty is in the reward
            entropy_coef=self.config.entropy_coef,
        )
        return loss, metrics
