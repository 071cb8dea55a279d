"""Options of `reinforce_pp`: torch-free, so loading the plugin to validate a config stays light."""

from __future__ import annotations

from pydantic import Field

from agentgym_core.api import ClippedLossOptions


class ReinforcePPConfig(ClippedLossOptions):
    """Options of `reinforce_pp`."""

    kl_coef: float = Field(
        0.01,
        ge=0,
        description="Weight of the per-token KL penalty log(pi / pi_ref) folded into the "
        "reward; 0 drops the reference model.",
    )
    gamma: float = Field(
        1.0, ge=0, le=1, description="Discount per agent token (observation tokens are bridged)."
    )
    baseline: bool = Field(
        False,
        description="REINFORCE++-baseline: subtract the group's mean outcome before the "
        "global normalization (needs trainer.group_size >= 2).",
    )
    eps: float = Field(1e-8, gt=0, description="Added to the batch std before dividing.")
