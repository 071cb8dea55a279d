"""Options of `dpo`: torch-free, so loading the plugin to validate a config stays light."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class DPOConfig(BaseModel):
    """Options of `dpo`."""

    model_config = ConfigDict(extra="forbid")

    beta: float = Field(0.1, gt=0, description="Strength of the implicit KL to the reference.")
    label_smoothing: float = Field(
        0.0, ge=0, lt=0.5, description="Assumed rate of flipped preferences (cDPO); 0: plain DPO."
    )
    pairs_from: str | None = Field(
        None,
        description="An earlier pipeline stage whose saved rollouts (tracking.save_rollouts) "
        "give the pairs: a successful and a failed trajectory of the same task.",
    )
    pairs_files: list[str] = Field(
        default_factory=list,
        description="Pair files or globs: JSON lists of {item_id, chosen: [turns], "
        "rejected: [turns]} with turns as in AgentTraj.",
    )
    max_pairs_per_task: int = Field(
        4, gt=0, description="Most pairs built per task from pairs_from (no trajectory reused)."
    )
    batch_size: int = Field(8, gt=0, description="Pairs per optimizer step.")

    @model_validator(mode="after")
    def _has_data(self) -> DPOConfig:
        if self.pairs_from is None and not self.pairs_files:
            raise ValueError(
                "no preference pairs: set pairs_from (a stage name) and/or pairs_files"
            )
        return self
