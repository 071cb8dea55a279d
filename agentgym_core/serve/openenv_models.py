"""The shapes of OpenEnv's wire protocol, as `agentgym serve-env --protocol openenv` speaks it.

Written from `openenv` 0.10.0's own types (`openenv.core.env_server.types`,
unchanged since `openenv-core` 0.3): the same field names, the same error
codes, the same `{"observation": ..., "reward": ..., "done": ...}` envelope,
so its `EnvClient`s (and TRL's and SkyRL's OpenEnv integrations) read our
replies unchanged. What is ours: the
fields of the action, observation and state of an AgentGym environment.
"""

from __future__ import annotations

import enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_ACTION_CHARS = 65_536
"""The longest action text accepted: longer is a VALIDATION_ERROR, never sent to the env."""


class ErrorCode(enum.StrEnum):
    """OpenEnv's `WSErrorCode`s, the `code` of an error message on `/ws`."""

    INVALID_JSON = "INVALID_JSON"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    EXECUTION_ERROR = "EXECUTION_ERROR"
    CAPACITY_REACHED = "CAPACITY_REACHED"
    FACTORY_ERROR = "FACTORY_ERROR"
    SESSION_ERROR = "SESSION_ERROR"


class TextAction(BaseModel):
    """One action of the agent: the text the env's `step` receives."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(max_length=MAX_ACTION_CHARS, description="The action, as the agent wrote it.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Ignored by the env.")


class TextObservation(BaseModel):
    """What the agent sees after a reset or a step."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(description="The observation text.")
    available_actions: list[str] | None = Field(
        None, description="Every action valid now, where the env can list them; else null."
    )
    task_id: int | None = Field(None, description="The task of this episode.")
    task_group: str | None = Field(None, description="The task's group (a level, a difficulty).")
    done: bool = Field(False, description="The episode is over.")
    reward: float | None = Field(None, description="Reward of the last action (null at reset).")
    metadata: dict[str, Any] = Field(
        default_factory=dict,
        description="`success` (bool, once done), `truncated`, and the env's step info.",
    )


class EpisodeState(BaseModel):
    """A session's episode: OpenEnv's `State` (episode_id, step_count) and what we add."""

    model_config = ConfigDict(extra="allow")

    episode_id: str | None = Field(None, description="Set by reset (yours, or a fresh uuid).")
    step_count: int = Field(0, ge=0, description="Steps taken in this episode.")
    task_id: int | None = Field(None, description="The task being played.")
    task_group: str | None = None
    done: bool = False
    score: float = Field(0.0, description="Sum of this episode's rewards.")


class ResetOptions(BaseModel):
    """Which task a reset starts: `task_id`; or `split` and `index`; else one drawn by `seed`.

    With no task named, the task is drawn from `split` (default train) by
    `seed` (the same seed gives the same task), or at random without one.
    Other keys are accepted and ignored, as OpenEnv's own server drops the
    reset keywords its env does not take (`ignored_keys` names them).
    """

    model_config = ConfigDict(extra="allow")

    task_id: int | None = Field(None, ge=0, description="A task id of either split.")
    split: str | None = Field(None, description="`train` or `test`.")
    index: int | None = Field(None, ge=0, description="Position in `split`'s task list.")
    seed: int | None = Field(None, ge=0, description="Draws the task when none is named.")
    episode_id: str | None = Field(None, max_length=255, description="Names the episode.")

    def ignored_keys(self) -> list[str]:
        """The keys given that this server does not know (and so ignores)."""
        return sorted(self.model_extra or {})


class ResetBody(ResetOptions):
    """`POST /reset`: the reset options at the top level, as OpenEnv's `ResetRequest`."""


class StepBody(BaseModel):
    """`POST /step`: stateless, so it names the task to reset to before its one step.

    Unknown keys are ignored, as by OpenEnv's `StepRequest`.
    """

    model_config = ConfigDict(extra="ignore")

    action: TextAction
    timeout_s: float | None = Field(None, gt=0, description="Accepted and ignored (OpenEnv's).")
    request_id: str | None = Field(None, max_length=255)
    task_id: int | None = Field(None, ge=0)
    split: str | None = None
    index: int | None = Field(None, ge=0)
    seed: int | None = Field(None, ge=0)

    def reset_options(self) -> ResetOptions:
        """The task to reset to before the step."""
        return ResetOptions(
            task_id=self.task_id, split=self.split, index=self.index, seed=self.seed
        )


class Envelope(BaseModel):
    """OpenEnv's reply to a reset or a step: the observation, and its reward and done beside."""

    observation: dict[str, Any]
    reward: float | None = None
    done: bool = False


class Metadata(BaseModel):
    """OpenEnv's `EnvironmentMetadata`; `description` is the env's instruction prompt."""

    name: str
    description: str
    readme_content: str | None = None
    version: str | None = None
    author: str | None = None
    documentation_url: str | None = None


def envelope(observation: TextObservation) -> dict[str, Any]:
    """`observation` as OpenEnv serialises one: reward and done beside it, not inside."""
    inner = observation.model_dump(exclude={"reward", "done"})
    return {"observation": inner, "reward": observation.reward, "done": observation.done}


def error_message(code: ErrorCode, message: str, **extra: Any) -> dict[str, Any]:
    """An error on `/ws`, as OpenEnv's `WSErrorResponse`."""
    return {"type": "error", "data": {"message": message, "code": code.value, **extra}}
