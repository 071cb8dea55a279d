"""Config models shared by the algorithm plugins, kept free of torch.

An algorithm's config model is imported whenever plugins load (to validate a
config, to list options, in every env server process); its loss, and torch,
only when a run builds the algorithm.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ClippedLossOptions(BaseModel):
    """The options every clipped-loss algorithm has; an algorithm's config subclasses this.

    `kl_coef` is each algorithm's own: it acts in the loss (GRPO, GiGPO) or in the
    reward (PPO, RLOO, REINFORCE++), and its default and meaning differ.
    """

    model_config = ConfigDict(extra="forbid")

    clip_eps: float = Field(0.2, gt=0, description="Lower (and default upper) ratio clip.")
    clip_eps_high: float | None = Field(
        None, gt=0, description="Upper ratio clip if different (DAPO's clip-higher)."
    )
    entropy_coef: float = Field(0.0, ge=0, description="Weight of the entropy bonus.")
