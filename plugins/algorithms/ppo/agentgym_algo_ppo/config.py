"""Options of `ppo`: torch-free, so loading the plugin to validate a config stays light."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agentgym_core.api import ClippedLossOptions


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
