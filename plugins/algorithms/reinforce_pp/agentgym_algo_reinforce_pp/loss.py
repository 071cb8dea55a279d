"""REINFORCE++: REINFORCE with PPO's tricks and no critic.

Paper: Hu et al., "REINFORCE++: An Efficient RLHF Algorithm with Robustness to
Both Prompt and Reward Models", https://arxiv.org/abs/2501.03262.

Per agent token t the reward is -kl_coef * log(pi_old / pi_ref), and the last
token the agent generated also gets the outcome reward; observation tokens in
between are bridged, not rewarded (`agentgym_core.learner.rewards`). The
advantage is the discounted return over the agent's remaining tokens,
normalized over every agent token of the global batch. `baseline: true` is
REINFORCE++-baseline: each outcome first loses the mean outcome of its group
(samples of the same task). The loss is PPO's clipped surrogate.
"""

from __future__ import annotations

import torch

from agentgym_algo_reinforce_pp.config import ReinforcePPConfig
from agentgym_core.api import (
    AlgorithmNeeds,
    LossInputs,
    TrajectoryBatch,
    clipped_loss_with_kl_and_entropy,
    spread,
    token_rewards,
    whiten,
)


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    """G_t = r_t + gamma * G_{t+1}, over one episode's agent tokens."""
    returns, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running
        returns[t] = running
    return returns


class ReinforcePP:
    """The `reinforce_pp` algorithm."""

    def __init__(self, config: ReinforcePPConfig) -> None:
        self.config = config
        self.needs = AlgorithmNeeds(
            online=True,
            reference=config.kl_coef > 0,
            group_size=2 if config.baseline else 1,
            entropy_grad=config.entropy_coef > 0,
        )

    def advantages(self, batch: TrajectoryBatch) -> None:
        """Per-token KL-penalized returns, whitened over the whole batch."""
        for group in batch.groups().values():
            shift = sum(t.reward for t in group) / len(group) if self.config.baseline else 0.0
            for trajectory in group:
                rewards = token_rewards(
                    trajectory, outcome=trajectory.reward - shift, kl_coef=self.config.kl_coef
                )
                returns = discounted_returns(rewards, self.config.gamma)
                trajectory.advantages = spread(trajectory, returns)
        whiten(batch.trainable, eps=self.config.eps)

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped policy loss - entropy_coef * entropy, token mean (the KL is in the reward)."""
        loss, metrics = clipped_loss_with_kl_and_entropy(
            inputs,
            clip_low=self.config.clip_eps,
            clip_high=self.config.clip_eps_high,
            kl_coef=0.0,  # the KL penalty is in the reward
            entropy_coef=self.config.entropy_coef,
        )
        if inputs.ref_logprobs is not None:
            with torch.no_grad():  # reported only: the penalty acts through the reward
                kl = (inputs.logprobs - inputs.ref_logprobs) * inputs.mask
                metrics["kl"] = float(kl.sum() / inputs.mask.sum().clamp(min=1.0))
        return loss, metrics
