"""How `agentgym serve-env` answers: as AgentGym's server for the env (default), or strictly.

AgentGym's own clients (`agentenv`'s `BabyAIEnvClient`, `TextCraftEnvClient`)
assert HTTP 200 on every call and find errors in an `error` field, and their
servers differ per env (BabyAI refuses steps after done, TextCraft does not;
TextCraft resets a new id at once and answers `/observation` with a bare
string). So by default we answer as that env's AgentGym server does, and
`--strict` keeps real status codes with FastAPI's body naming the field, for
clients that would rather have them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from fastapi import HTTPException
from fastapi.responses import JSONResponse

from agentgym_core.rollout import contract
from agentgym_core.serve.sessions import EnvCallTimeout, Phase, Session


@dataclass(frozen=True)
class Dialect:
    """The behaviours in which AgentGym's servers differ per env, plus the answering mode."""

    name: str
    """AgentGym's name of the env, in `GET /`'s greeting."""
    strict: bool = False
    """Errors as HTTP status codes (404, 409, 422, 500) instead of 200 `{"error": ...}`."""
    locks_when_done: bool = True
    """Refuse `/step` after the episode ended until the next reset (BabyAI, SciWorld)."""
    resets_on_create: bool = False
    """`/create` starts episode `data_idx = id` and answers its observation (TextCraft)."""
    bare_observation: bool = False
    """`GET /observation` answers a JSON string, not an object (TextCraft, SciWorld)."""
    wraps_task_ids: bool = False
    """Any integer `data_idx` is taken modulo the number of tasks, negative ones too (TextCraft)."""
    close_needs_reset: bool = False
    """`/close` of an id never reset answers `false` and keeps the id (BabyAI)."""
    reset_says_deleted: bool = False
    """The reset reply carries `"deleted": false` (BabyAI)."""
    has_detail: bool = False
    """`GET /detail?id=` answers the last reply's fields plus `deleted` (TextCraft)."""

    @property
    def greeting(self) -> str:
        """What AgentGym's servers answer on `GET /`."""
        return f"This is environment {self.name}."

    def number(self, value: float) -> int | float:
        """A reward or score as sent: AgentGym's servers send whole numbers as integers."""
        if not self.strict and math.isfinite(value) and value == int(value):
            return int(value)
        return value

    def step_phases(self) -> tuple[Phase, ...]:
        """Phases in which `/step` is served."""
        if self.locks_when_done:
            return (Phase.RUNNING,)
        return (Phase.RUNNING, Phase.DONE)


AGENTGYM_DIALECTS = {
    "babyai": Dialect("BabyAI", close_needs_reset=True, reset_says_deleted=True),
    "textcraft": Dialect(
        "TextCraft",
        locks_when_done=False,
        resets_on_create=True,
        bare_observation=True,
        wraps_task_ids=True,
        has_detail=True,
    ),
    "sciworld": Dialect("ScienceWorld", bare_observation=True),
    "search": Dialect("SearchQA"),
}
"""Our env names whose AgentGym server we answer as; others get `Dialect(<our name>)`."""


def dialect_for(env_name: str, *, strict: bool = False) -> Dialect:
    """The dialect of `env_name`; strict mode keeps only its name (one behaviour for all envs)."""
    dialect = AGENTGYM_DIALECTS.get(env_name, Dialect(env_name))
    return Dialect(dialect.name, strict=True) if strict else replace(dialect, strict=False)


class EnvError(Exception):
    """An environment-level refusal, answered per mode by `answer`.

    Strict mode: HTTP `status` with FastAPI's body naming the field `loc` (or a
    plain `detail` string when no field is at fault). AgentGym's mode: HTTP 200
    with `{"error": agentgym}`, AgentGym's own words where it has them.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        loc: list[str] | None = None,
        kind: str = "",
        agentgym: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.loc, self.kind = status, message, loc, kind
        self.agentgym = agentgym or message

    def strict_body(self) -> dict[str, Any]:
        """FastAPI's error body: the field at fault, or the message alone."""
        if self.loc is None:
            return {"detail": self.message}
        return {"detail": [{"loc": self.loc, "msg": self.message, "type": self.kind}]}


def answer(error: EnvError, strict: bool) -> JSONResponse:
    """The reply to `error` in the server's mode."""
    if strict:
        return JSONResponse(status_code=error.status, content=error.strict_body())
    return JSONResponse(status_code=200, content={"error": error.agentgym})


def unknown_id(session_id: int, where: str) -> EnvError:
    """No session `session_id`: 404, or AgentGym's `The id N is not valid.`."""
    return EnvError(
        404,
        f"no session with id {session_id} (closed, reaped when idle, or never created)",
        loc=[where, "id"],
        kind="unknown_id",
        agentgym=f"The id {session_id} is not valid.",
    )


def wrong_phase(session: Session, where: str) -> EnvError:
    """The episode's phase does not allow the call: 409, or AgentGym's words."""
    if session.phase is Phase.DONE:
        reason = "finished its episode: POST /reset to start another"
        agentgym = f"The task with environment {session.id} has finished."
    else:
        reason = "has not been reset yet: POST /reset first"
        agentgym = f"The task with environment {session.id} has not been reset yet."
    return EnvError(
        409,
        f"session {session.id} {reason}",
        loc=[where, "id"],
        kind="episode_state",
        agentgym=agentgym,
    )


def bad_task(env_name: str, data_idx: int, error: BaseException) -> EnvError:
    """The env rejected task `data_idx`: 422 naming `data_idx`, or 200 with the reason."""
    return EnvError(
        422,
        f"{env_name} cannot reset task {data_idx}: {type(error).__name__}: {error}",
        loc=["body", "data_idx"],
        kind="invalid_task",
    )


def env_failure(env_name: str, doing: str, error: BaseException) -> NoReturn:
    """Raise for an env call that failed: 504 on timeout (both modes), else an `EnvError` (500)."""
    if isinstance(error, EnvCallTimeout):
        raise HTTPException(504, detail=f"environment {env_name}: {doing}: {error}") from error
    raise EnvError(
        500, f"environment {env_name}: {doing} raised {type(error).__name__}: {error}"
    ) from error


# -- contract violations: the same 500 in every mode ---------------------------------------

_FIXES = {
    "reset": "reset(task_id) must return the first observation as a str",
    "step": "step(action) must return agentgym_core.types.StepResult(observation: str, "
    "reward: float, done: bool, truncated: bool = False, info: dict = {})",
    "valid_actions": "valid_actions() must return None (actions not enumerable) or a list of str",
    "task_group": "task_group(task_id) must return a str, such as the task's level",
    "instruction": "instruction() must return the instruction prompt as a str",
}
_GYMNASIUM_FIX = (
    "; a Gymnasium (observation, reward, terminated, truncated, info) tuple becomes "
    "StepResult(observation, reward, terminated, truncated, info)"
)


class ContractViolation(Exception):
    """An env method returned what the Environment protocol does not allow.

    Not the env failing (it did not raise) nor the client's fault, but a bug in
    the env's plugin: answered as HTTP 500 in every mode, with a body that names
    the env, the method, the type of the value and the fix.
    """

    def __init__(
        self, env_name: str, method: str, value: Any, error: contract.EnvironmentContractError
    ) -> None:
        fix = _FIXES[method]
        if method == "step" and isinstance(value, tuple) and len(value) == 5:
            fix += _GYMNASIUM_FIX
        message = f"environment {env_name} broke the Environment contract: {error}"
        super().__init__(message)
        self.body = {
            "detail": message,
            "contract_violation": {
                "env": env_name,
                "method": f"{method}()",
                "value_type": type(value).__name__,
                "fix": fix,
            },
        }

    def response(self) -> JSONResponse:
        """HTTP 500 with the body above."""
        return JSONResponse(status_code=500, content=self.body)


def checked(env_name: str, env: Any, method: str, value: Any) -> Any:
    """`value` as `method` returned it, checked by the rollout engine's own contract checks."""
    try:
        if method == "step":
            return contract.step(env, value)
        if method == "valid_actions":
            return contract.actions(env, value)
        return contract.text(env, method, value)
    except contract.EnvironmentContractError as error:
        raise ContractViolation(env_name, method, value, error) from error
