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

from typing import Literal

import torch
from pydantic import Field, model_validator

from agentgym_core.api import (
    AlgorithmNeeds,
    ClippedLossOptions,
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


class PPOConfig(ClippedLossOptions):
    """Options of `ppo`."""

    gamma: float = Field(1.0, ge=0, le=1, description="Discount per agent token.")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda (1: Monte Carlo returns).")
    value_clip: float | None = Field(
        0.2, gt=0, description="Values move at most this far from the rollout's; null: no clip."
    )
    vf_coef: float = Field(0.5, ge=0, description="Weight of the value loss.")
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="Per-token KL penalty log(pi / pi_ref) in the reward; 0 drops the reference.",
    )
    normalize_advantages: bool = Field(
        True, description="Whiten advantages over the batch's agent tokens."
    )
    critic: Literal["head", "model"] = Field(
        "head",
        description="head: a linear value head on the policy's last hidden state; "
        "model: a separate critic model with its own body and head.",
    )
    critic_path: str | None = Field(
        None,
        min_length=1,
        description="Checkpoint folder of the separate critic's body; null: the starting model.",
    )
    critic_lr: float | None = Field(
        None, gt=0, description="Peak learning rate of the critic; null: trainer.lr."
    )
    critic_warmup: int = Field(
        0, ge=0, description="First N updates train only the critic (the policy stays fixed)."
    )

    @model_validator(mode="after")
    def _warmup_trains_something(self) -> PPOConfig:
        if self.critic_warmup and not self.vf_coef:
            raise ValueError(
                "critic_warmup needs vf_coef > 0: warm-up updates train only the value"
            )
        if self.critic_path and self.critic != "model":
            raise ValueError("critic_path is the separate critic's weights: set critic: model")
        return self


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
