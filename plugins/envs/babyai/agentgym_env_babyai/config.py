"""Options of the `babyai` environment."""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_LEVELS = ["GoToObj", "GoToLocal", "PickupDist", "OpenDoor", "PutNextLocal"]


@cache
def known_levels() -> tuple[str, ...]:
    """Short names of every BabyAI level registered by minigrid (`GoToLocal`, ...)."""
    import gymnasium as gym
    import minigrid  # noqa: F401 - registers the BabyAI levels

    names = {
        env_id[len("BabyAI-") :].rsplit("-v", 1)[0]
        for env_id in gym.registry
        if env_id.startswith("BabyAI-")
    }
    return tuple(sorted(names))


class BabyAIConfig(BaseModel):
    """Which BabyAI levels to play and how many tasks each split has."""

    model_config = ConfigDict(extra="forbid")

    levels: list[str] = Field(
        default_factory=lambda: list(DEFAULT_LEVELS),
        min_length=1,
        description="BabyAI level names without prefix and version, e.g. GoToLocal, PutNextLocal.",
    )
    train_seeds: int = Field(1000, gt=0, description="Train tasks per level (seeds 0..N-1).")
    test_seeds: int = Field(
        100, gt=0, description="Held-out test tasks per level (seeds from 1,000,000)."
    )
    repeat_goal: bool = Field(
        True,
        description="Start every observation with the goal, not only the first "
        "(AgentGym's server shows it once; repeating it keeps it close for small models).",
    )
    instruction: str | None = Field(
        None,
        description="Instruction prompt opening each conversation; null: the built-in one "
        "(AgentGym-style, lists the action syntax).",
    )
    list_actions: bool = Field(
        True, description="End each observation with `Available actions: [...]`, as AgentGym does."
    )

    @field_validator("levels")
    @classmethod
    def _known(cls, levels: list[str]) -> list[str]:
        valid = known_levels()
        for level in levels:
            if level not in valid:
                raise ValueError(f"unknown level {level!r}; valid levels: {', '.join(valid)}")
        return levels
