"""Request and reply bodies of `agentgym serve-env` (field names are AgentGym's).

Apart from the app so that both answering modes (AgentGym's and `--strict`)
share one schema, and the routes stay readable.
"""

from __future__ import annotations

import base64
import io
import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_TASK_ID = 2**53 - 1
"""Largest id or `data_idx` accepted in strict mode (what a JSON number holds exactly)."""
MAX_ACTION_CHARS = 20_000
"""Strict mode refuses longer actions with 422: no agent turn is that long."""
_ID = Field(ge=0, le=MAX_TASK_ID, description="The session id `POST /create` returned.")
Number = int | float
"""A reward or score: AgentGym's servers send 0 and 1 as integers, minigrid's rewards as floats."""


# -- bodies -------------------------------------------------------------------------------
#
# Two sets of request bodies, one per answering mode. AgentGym's mode takes what
# AgentGym's FastAPI servers take: any integer id and `data_idx` (the env decides),
# any action length, unknown fields ignored. Strict mode bounds each field and
# refuses unknown ones, with FastAPI's 422 naming the field. The strict bodies
# subclass the AgentGym ones, so a route is typed once for both.


class CreateRequest(BaseModel):
    """Body of `POST /create`; TextCraft's `commands`/`goal` keys are accepted and ignored."""

    model_config = ConfigDict(extra="allow")


class CreateResponse(BaseModel):
    """A new session; `observation`, `reward` and `done` as TextCraft's server answers them."""

    id: int = Field(description="Session id to pass to every later call.")
    observation: str = Field(
        "", description="Empty until the first reset; TextCraft's (AgentGym mode) is reset already."
    )
    reward: Number = Field(0, description="Always 0.")
    done: bool = Field(False, description="Always false.")


class IdRequest(BaseModel):
    """A body naming a session."""

    model_config = ConfigDict(extra="ignore")
    id: int = Field(description="The session id `POST /create` returned.")


class ResetRequest(IdRequest):
    """Start the episode `data_idx` in session `id`."""

    data_idx: int = Field(0, description="Task id of the environment.")


class StepRequest(IdRequest):
    """Apply one action in session `id`."""

    action: str = Field(description="The action text.")


class StrictIdRequest(IdRequest):
    """A body naming a session (strict mode: no unknown fields)."""

    model_config = ConfigDict(extra="forbid")
    id: int = _ID


class StrictResetRequest(ResetRequest):
    """Start the episode `data_idx` in session `id` (strict mode)."""

    model_config = ConfigDict(extra="forbid")
    id: int = _ID
    data_idx: int = Field(0, ge=0, le=MAX_TASK_ID, description="Task id of the environment.")


class StrictStepRequest(StepRequest):
    """Apply one action in session `id` (strict mode: at most `MAX_ACTION_CHARS`)."""

    model_config = ConfigDict(extra="forbid")
    id: int = _ID
    action: str = Field(max_length=MAX_ACTION_CHARS, description="The action text.")


@dataclass(frozen=True)
class Bodies:
    """The request bodies of one answering mode."""

    close: type[IdRequest]
    reset: type[ResetRequest]
    step: type[StepRequest]


def request_bodies(strict: bool) -> Bodies:
    """Strict mode's bounded bodies, or the lenient ones AgentGym's servers take."""
    if strict:
        return Bodies(StrictIdRequest, StrictResetRequest, StrictStepRequest)
    return Bodies(IdRequest, ResetRequest, StepRequest)


class ResetResponse(BaseModel):
    """The first observation of an episode (AgentGym's fields plus ours).

    AgentGym's mode adds what that env's server adds (BabyAI's `deleted: false`).
    """

    model_config = ConfigDict(extra="allow")
    id: int = Field(description="The session id (TextCraft's server echoes it).")
    observation: str = Field(description="Goal and initial state.")
    reward: Number = Field(0, description="Always 0 on reset.")
    score: Number = Field(0, description="Sum of rewards so far: 0 on reset.")
    done: bool = Field(False, description="Always false on reset.")
    available_actions: list[str] | None = Field(
        None, description="Every valid action, where the environment enumerates them."
    )
    task_group: str = Field("", description="The environment's label of the task (a level).")


class StepResponse(BaseModel):
    """What one action did."""

    observation: str = Field(description="What the environment answered.")
    reward: Number = Field(description="Reward of this step.")
    score: Number = Field(description="Sum of the episode's rewards so far.")
    done: bool = Field(
        description="The episode is over; step is refused until the next reset (not by TextCraft)."
    )
    truncated: bool = Field(False, description="The environment cut the episode short.")
    available_actions: list[str] | None = Field(
        None, description="Every valid action now, where the environment enumerates them."
    )
    info: dict[str, Any] = Field(default_factory=dict, description="The environment's extras.")


class ObservationResponse(BaseModel):
    """The current observation of a session (BabyAI's server answers this object)."""

    observation: str = Field(description="The last observation sent to the client.")
    reward: Number = Field(0, description="Reward of the last step (0 after a reset).")
    score: Number = Field(0, description="Sum of the episode's rewards so far.")
    done: bool = Field(False, description="The episode is over.")


class DetailResponse(BaseModel):
    """TextCraft's `GET /detail` (AgentGym's mode): the session's last reply."""

    observation: str = Field(description="The last observation.")
    done: bool = Field(description="Whether the last step ended the episode.")
    reward: Number = Field(description="Reward of the last step (0 after a reset).")
    deleted: bool = Field(False, description="Always false: closed ids are unknown.")


class ErrorReply(BaseModel):
    """AgentGym's way of refusing (default mode): HTTP 200 with the reason."""

    error: str = Field(description="What was wrong, in AgentGym's words where it has them.")


class RenderResponse(BaseModel):
    """A picture or text drawing of the current state."""

    format: Literal["png", "text"] = Field(description="`png`: base64 PNG bytes; `text`.")
    data: str = Field(description="The base64 PNG, or the text.")


class InfoResponse(BaseModel):
    """What this server serves and how busy it is."""

    env: str = Field(description="Registered name of the environment served.")
    version: str = Field(description="agentgym-core version.")
    sessions: int = Field(description="Sessions open now.")
    max_sessions: int = Field(description="Sessions allowed at once.")
    created: int = Field(description="Sessions created since start.")
    closed: int = Field(description="Sessions closed since start (by clients or reaped).")
    idle_timeout_s: float = Field(description="Sessions idle this long are closed.")
    can_render: bool = Field(description="Whether `GET /render` exists.")
    strict: bool = Field(description="Errors as status codes (`--strict`), not AgentGym's 200s.")
    instance: str = Field(
        description="Random per server start, also in every reply's `X-AgentGym-Instance` header."
    )


class TasksResponse(BaseModel):
    """Task ids of one split."""

    split: str = Field(description="`train` or `test`.")
    tasks: list[int] = Field(description="Task ids, in the environment's order.")


class InstructionResponse(BaseModel):
    """The environment's own instruction prompt."""

    instruction: str = Field(description="Opens every conversation.")


# -- building replies ----------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """`value` made JSON-safe (non-finite floats become null, unknown objects strings)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return json.loads(json.dumps(value, default=str))


def finite(value: float) -> float:
    """`value`, or 0 where it is not finite (JSON has no NaN)."""
    return float(value) if math.isfinite(value) else 0.0


def render_payload(image: Any) -> RenderResponse:
    """`render()`'s result as a response: text, PNG bytes, or an RGB array encoded as PNG."""
    if isinstance(image, str):
        return RenderResponse(format="text", data=image)
    if isinstance(image, bytes | bytearray):
        return RenderResponse(format="png", data=base64.b64encode(bytes(image)).decode())
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(image).save(buffer, format="PNG")
    return RenderResponse(format="png", data=base64.b64encode(buffer.getvalue()).decode())
