"""Options of `grpo`: torch-free, so loading the plugin to validate a config stays light."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from agentgym_core.api import ClippedLossOptions, GroupStd, older_scale_by_std


class GRPOConfig(ClippedLossOptions):
    """Options of `grpo`."""

    kl_coef: float = Field(
        0.0, ge=0, description="Weight of the k3 KL to the frozen reference; 0 drops the reference."
    )
    std: GroupStd = Field(
        "population",
        description="Divide by the group's reward std: population (over n, the paper's code), "
        "sample (over n - 1, as gigpo), or none: mean-centred only, Dr. GRPO. The older "
        "`scale_by_std: false` still reads as none.",
    )
    eps: float = Field(1e-6, gt=0, description="Added to the std before dividing.")
    min_group_size: int = Field(2, ge=2, description="Group size the trainer must provide.")
    drop_uniform_groups: bool = Field(
        False,
        description="Leave out groups whose rewards are all equal (zero advantage), as DAPO's "
        "dynamic sampling does: they only dilute the token mean and cost learner time.",
    )

    @model_validator(mode="before")
    @classmethod
    def _older_scale_by_std(cls, data: Any) -> Any:
        """Read `scale_by_std`, which `std` replaced: false is `std: none`."""
        return older_scale_by_std(data)
