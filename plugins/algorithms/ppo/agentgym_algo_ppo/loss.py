"""PPO: Proximal Policy Optimization with a learned value function and GAE.

Papers: Schulman et al., "Proximal Policy Optimization Algorithms",
https://arxiv.org/abs/1707.06347; "High-Dimensional Continuous Control Using
Generalized Advantage Estimation", https://arxiv.org/abs/1506.02438; the
token-level LLM setting of Ouyang et al., https://arxiv.org/abs/2203.02155.

Multi-turn episodes: rewards, values and advantages live on the tokens the
agent generated. The outcome reward sits on the last generated token (never on
a trailing observation token), each agent token pays kl_coef * log(pi / pi_ref),
and GAE runs over the agent tokens in order, bridging the observation tokens
between turns: the last token of turn k bootstraps from the value of the first
token of turn k + 1. Every episode end is terminal (V = 0 after it), a horizon
cut included, as the env's reward at the cut is final.
"""

from __future__ import annotations

import torch

from agentgym_algo_ppo.config import PPOConfig
from agentgym_core.api import (
    AlgorithmNeeds,
    CriticSpec,
    LossInputs,
    TrajectoryBatch,
    agent_values,
    clipped_loss_with_kl_and_entropy,
    clipped_value_loss,
    spread,
    token_rewards,
    whiten,
)


def gae(
    rewards: list[float], values: list[float], gamma: float, lam: float
) -> tuple[list[float], list[float]]:
    """Advantages and returns over one episode's agent tokens (V = 0 after the last).

    delta_k = r_k + gamma * V_{k+1} - V_k;  A_k = delta_k + gamma * lam * A_{k+1};
    return_k = A_k + V_k (the critic's target).
    """
    advantages, running = [0.0] * len(rewards), 0.0
    for k in reversed(range(len(rewards))):
        next_value = values[k + 1] if k + 1 < len(values) else 0.0
        delta = rewards[k] + gamma * next_value - values[k]
        running = delta + gamma * lam * running
        advantages[k] = running
    return advantages, [a + v for a, v in zip(advantages, values, strict=True)]


class PPO:
    """The `ppo` algorithm."""

    def __init__(self, config: PPOConfig) -> None:
        self.config = config
        critic = CriticSpec(
            separate=config.critic == "model",
            path=config.critic_path,
            lr=config.critic_lr,
            warmup_updates=config.critic_warmup,
        )
        self.needs = AlgorithmNeeds(
            online=True,
            reference=config.kl_coef > 0,
            critic=critic,
            entropy_grad=config.entropy_coef > 0,
        )

    def advantages(self, batch: TrajectoryBatch) -> None:
        """GAE advantages and value targets on every agent token of each trajectory."""
        for trajectory in batch.trainable:
            rewards = token_rewards(
                trajectory, outcome=trajectory.reward, kl_coef=self.config.kl_coef
            )
            advantages, returns = gae(
                rewards, agent_values(trajectory), self.config.gamma, self.config.lam
            )
            trajectory.advantages = spread(trajectory, advantages)
            trajectory.returns = spread(trajectory, returns)
        if self.config.normalize_advantages:
            whiten(batch.trainable)

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped policy loss + vf_coef * clipped value loss - entropy_coef * entropy."""
        if inputs.values is None or inputs.old_values is None or inputs.returns is None:
            raise ValueError("ppo's loss needs the critic's values: the learner runs without one")
        loss, metrics = clipped_loss_with_kl_and_entropy(
            inputs,
            clip_low=self.config.clip_eps,
            clip_high=self.config.clip_eps_high,
            kl_coef=0.0,  # the KL penalty is in the reward
            entropy_coef=self.config.entropy_coef,
        )
        value, value_metrics = clipped_value_loss(
            inputs.values,
            inputs.old_values,
            inputs.returns,
            inputs.mask,
            inputs.normalizer,
            clip=self.config.value_clip,
        )
        return loss + self.config.vf_coef * value, {**metrics, **value_metrics}
