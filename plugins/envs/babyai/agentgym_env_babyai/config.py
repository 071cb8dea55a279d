"""Options of the `babyai` environment."""

from __future__ import annotations

from functools import cache
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

AGENTGYM = "agentgym"
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

    levels: list[str] | Literal["agentgym"] = Field(
        default_factory=lambda: list(DEFAULT_LEVELS),
        min_length=1,
        description="BabyAI level names without prefix and version, e.g. GoToLocal, PutNextLocal; "
        "or `agentgym`: AgentGym's BabyAI server (its 40 levels, data_idx, text, actions, reward).",
    )
    agentgym_levels: list[int | str] | None = Field(
        None,
        description="With `levels: agentgym`, play only these of its 40 levels (numbers 1-40 or "
        "names such as GoToRedBall); task ids keep AgentGym's data_idx. null: all 40.",
    )
    train_seeds: int = Field(1000, gt=0, description="Train tasks per level (seeds 0..N-1).")
    test_seeds: int = Field(
        100, gt=0, description="Held-out test tasks per level (seeds from 1,000,000)."
    )
    repeat_goal: bool = Field(
        True,
        description="Start every observation with the goal, not only the first "
        "(AgentGym's server shows it once; repeating it keeps it close for small models). "
        "Minigrid's own levels only: `levels: agentgym` shows it once, as that server does.",
    )
    instruction: str | None = Field(
        None,
        description="Instruction prompt opening each conversation; null: the built-in one "
        "(AgentGym-style, lists the action syntax).",
    )
    agentgym_prompt: bool = Field(
        False,
        description="With `levels: agentgym`: talk as AgentGym's own BabyAI client does: its "
        "instruction (answer with `Thought:` then `Action:`), and the action read from the "
        "text after `Action:` (the whole text where there is none), letters, digits, commas "
        "and spaces only. `instruction` still replaces the instruction if set.",
    )
    list_actions: bool = Field(
        True,
        description="End each step's observation with `Available actions: [...]`, as AgentGym "
        "does (with `levels: agentgym` the first observation lists them either way, as "
        "AgentGym's reset does).",
    )
    expert_search: int = Field(
        0,
        ge=0,
        le=3,
        description="With `levels: agentgym`: the expert first looks this many macro actions "
        "ahead (on copies of the game) for a sequence that wins, and one further when no "
        "action follows minigrid's bot; 0: the bot alone (as the kept results were made).",
    )

    @field_validator("levels")
    @classmethod
    def _known(cls, levels: list[str] | str) -> list[str] | str:
        if isinstance(levels, str):
            return levels
        valid = known_levels()
        for level in levels:
            if level not in valid:
                raise ValueError(f"unknown level {level!r}; valid levels: {', '.join(valid)}")
        return levels

    @model_validator(mode="after")
    def _options_fit_levels(self) -> BabyAIConfig:
        """`expert_search` without AgentGym's levels is an error, not ignored.

        (`repeat_goal` is not checked: its default, true, is in every resolved config
        written so far, AgentGym ones included, and those must load again.)
        """
        if self.agentgym_levels is not None:
            if self.levels != AGENTGYM:
                raise ValueError("agentgym_levels needs levels: agentgym")
            self.level_numbers()  # names and numbers must be AgentGym's
        if self.expert_search and not self.is_agentgym:
            raise ValueError(
                "expert_search needs levels: agentgym (the searching expert plays AgentGym's "
                "macro actions)"
            )
        return self

    @property
    def is_agentgym(self) -> bool:
        """True for AgentGym's BabyAI (`levels: agentgym`)."""
        return self.levels == AGENTGYM

    def level_numbers(self) -> list[int]:
        """AgentGym level numbers (1-40) to play, in AgentGym's order."""
        from agentgym_env_babyai.agentgym.levels import LEVELS

        if self.agentgym_levels is None:
            return list(range(1, len(LEVELS) + 1))
        numbers = set()
        for level in self.agentgym_levels:
            if isinstance(level, int) or str(level).isdigit():
                number = int(level)
                if not 1 <= number <= len(LEVELS):
                    raise ValueError(f"agentgym level {number} is not in 1..{len(LEVELS)}")
            elif level in LEVELS:
                number = LEVELS.index(level) + 1
            else:
                raise ValueError(
                    f"unknown agentgym level {level!r}; AgentGym's levels: {', '.join(LEVELS)}"
                )
            numbers.add(number)
        return sorted(numbers)
