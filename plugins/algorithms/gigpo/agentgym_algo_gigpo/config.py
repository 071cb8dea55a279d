"""Options of `gigpo`: torch-free, so loading the plugin to validate a config stays light."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from agentgym_core.api import ClippedLossOptions, GroupStd, older_scale_by_std


class GiGPOConfig(ClippedLossOptions):
    """Options of `gigpo`."""

    omega: float = Field(
        1.0, ge=0, description="Weight of the step-level advantage (verl-agent's step_advantage_w)."
    )
    gamma: float = Field(
        0.95, ge=0, le=1, description="Discount of the per-turn rewards in each turn's return."
    )
    std: GroupStd = Field(
        "sample",
        description="Divide both advantages by their group's std: sample (over n - 1, "
        "verl-agent's mean_std_norm), population (over n, as grpo), or none: mean-centred "
        "only, verl-agent's default mean_norm. The default divides, unlike verl-agent's; it "
        "stays because kept results depend on it. The older `scale_by_std: false` still "
        "reads as none.",
    )
    episode_stats: Literal["trajectory", "step"] = Field(
        "trajectory",
        description="Episode-level mean/std over the group's trajectories (the paper's Eq. 3) "
        "or over their turns, each trajectory counted once per turn (verl-agent's default).",
    )
    eps: float = Field(1e-6, gt=0, description="Added to the std before dividing.")
    kl_coef: float = Field(
        0.0, ge=0, description="Weight of the k3 KL to the frozen reference; 0 drops the reference."
    )
    min_group_size: int = Field(2, ge=2, description="Group size the trainer must provide.")
    drop_uniform_groups: bool = Field(
        False,
        description="Leave out groups where every advantage is 0 (equal rewards and equal "
        "returns within every state group): they only dilute the token mean.",
    )

    @model_validator(mode="before")
    @classmethod
    def _older_scale_by_std(cls, data: Any) -> Any:
        """Read `scale_by_std`, which `std` replaced: false is `std: none`."""
        return older_scale_by_std(data)
