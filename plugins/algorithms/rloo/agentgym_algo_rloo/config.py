"""Options of `rloo`: torch-free, so loading the plugin to validate a config stays light."""

from __future__ import annotations

from pydantic import Field

from agentgym_core.api import ClippedLossOptions


class RLOOConfig(ClippedLossOptions):
    """Options of `rloo`."""

    kl_coef: float = Field(
        0.0,
        ge=0,
        description="Weight of the episode's summed log(pi / pi_ref) subtracted from its reward; "
        "0 drops the reference model.",
    )
    min_group_size: int = Field(2, ge=2, description="Group size the trainer must provide.")
