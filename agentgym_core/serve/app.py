"""`agentgym serve-env`: any installed environment over AgentGym's HTTP protocol (Family A).

The routes, bodies and field names are those of AgentGym's BabyAI and
TextCraft servers (`POST /create`, `/reset {id, data_idx}`, `/step {id,
action}`, `/close {id}`, `GET /observation?id=`), so their clients and ours
work unchanged. What differs is how errors come back: real status codes with
FastAPI's `{"detail": [{"loc": [...], "msg": ..., "type": ...}]}` body naming
the field, never HTTP 200 with an `error` field.

Extensions a client may use and AgentGym's ignore: replies carry
`available_actions`, `task_group` and `info`; `GET /info`, `/tasks?split=`,
`/instruction`; `GET /render?id=` when the environment can render.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal, NoReturn

from fastapi import FastAPI, HTTPException, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from agentgym_core import __version__
from agentgym_core.interfaces import Environment
from agentgym_core.serve.sessions import (
    EnvCallTimeout,
    Phase,
    Session,
    SessionStore,
    UnknownSession,
    using,
)

MAX_TASK_ID = 2**53 - 1
"""Largest `data_idx` accepted (what a JSON number holds exactly)."""
MAX_ACTION_CHARS = 20_000
"""Longer actions are refused with 422: no agent turn is that long."""
_ID = Field(ge=0, le=MAX_TASK_ID, description="The session id `POST /create` returned.")


# -- bodies -------------------------------------------------------------------------------


class CreateRequest(BaseModel):
    """Body of `POST /create`; TextCraft's `commands`/`goal` keys are accepted and ignored."""

    model_config = ConfigDict(extra="allow")


class CreateResponse(BaseModel):
    """A new session; `observation`, `reward` and `done` as TextCraft's server answers them."""

    id: int = Field(description="Session id to pass to every later call.")
    observation: str = Field("", description="Empty until the first reset.")
    reward: float = Field(0.0, description="Always 0.")
    done: bool = Field(False, description="Always false.")


class IdRequest(BaseModel):
    """A body naming a session."""

    model_config = ConfigDict(extra="forbid")
    id: int = _ID


class ResetRequest(IdRequest):
    """Start the episode `data_idx` in session `id`."""

    data_idx: int = Field(0, ge=0, le=MAX_TASK_ID, description="Task id of the environment.")


class StepRequest(IdRequest):
    """Apply one action in session `id`."""

    action: str = Field(max_length=MAX_ACTION_CHARS, description="The action text.")


class ResetResponse(BaseModel):
    """The first observation of an episode (AgentGym's fields plus ours)."""

    observation: str = Field(description="Goal and initial state.")
    reward: float = Field(0.0, description="Always 0 on reset.")
    score: float = Field(0.0, description="Sum of rewards so far: 0 on reset.")
    done: bool = Field(False, description="Always false on reset.")
    available_actions: list[str] | None = Field(
        None, description="Every valid action, where the environment enumerates them."
    )
    task_group: str = Field("", description="The environment's label of the task (a level).")


class StepResponse(BaseModel):
    """What one action did."""

    observation: str = Field(description="What the environment answered.")
    reward: float = Field(description="Reward of this step.")
    score: float = Field(description="Sum of the episode's rewards so far.")
    done: bool = Field(description="The episode is over; step is refused until the next reset.")
    truncated: bool = Field(False, description="The environment cut the episode short.")
    available_actions: list[str] | None = Field(
        None, description="Every valid action now, where the environment enumerates them."
    )
    info: dict[str, Any] = Field(default_factory=dict, description="The environment's extras.")


class ObservationResponse(BaseModel):
    """The current observation of a session."""

    observation: str = Field(description="The last observation sent to the client.")


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


class TasksResponse(BaseModel):
    """Task ids of one split."""

    split: str = Field(description="`train` or `test`.")
    tasks: list[int] = Field(description="Task ids, in the environment's order.")


class InstructionResponse(BaseModel):
    """The environment's own instruction prompt."""

    instruction: str = Field(description="Opens every conversation.")


# -- errors ---------------------------------------------------------------------------------


def field_error(status: int, loc: list[str], message: str, kind: str) -> HTTPException:
    """An HTTP error whose body has FastAPI's validation shape, naming the field at fault."""
    return HTTPException(status, detail=[{"loc": loc, "msg": message, "type": kind}])


def _unknown(session_id: int, where: str) -> HTTPException:
    return field_error(
        404,
        [where, "id"],
        f"no session with id {session_id} (closed, reaped when idle, or never created)",
        "unknown_id",
    )


def _env_failure(env_name: str, doing: str, error: BaseException) -> NoReturn:
    if isinstance(error, EnvCallTimeout):
        raise HTTPException(504, detail=f"environment {env_name}: {doing}: {error}") from error
    raise HTTPException(
        500, detail=f"environment {env_name}: {doing} raised {type(error).__name__}: {error}"
    ) from error


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


def _finite(value: float) -> float:
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


# -- the app --------------------------------------------------------------------------------


class EnvServer:
    """The state behind the routes: sessions, the reaper, a probe env for metadata."""

    def __init__(self, env_name: str, store: SessionStore, idle_timeout_s: float) -> None:
        self.env_name = env_name
        self.store = store
        self.idle_timeout_s = idle_timeout_s
        self._probe: Environment | None = None
        self._probe_lock = asyncio.Lock()

    async def probe(self) -> Environment:
        """An environment instance of its own for `tasks` and `instruction`, made on first use."""
        async with self._probe_lock:
            if self._probe is None:
                self._probe = await self.store.call(self.store.factory)
            return self._probe

    async def reaper(self) -> None:
        """Close idle sessions, checking four times per idle timeout."""
        interval = max(min(self.idle_timeout_s / 4, 30.0), 0.05)
        while True:
            await asyncio.sleep(interval)
            await self.store.reap(self.idle_timeout_s)

    async def shutdown(self) -> None:
        """Close every session and the probe."""
        if self._probe is not None:
            with contextlib.suppress(Exception):
                await self.store.call(self._probe.close)
        await self.store.close_all()

    def session(self, session_id: int, where: str = "body") -> Session:
        """The session or a 404 naming the `id` field."""
        try:
            return self.store.get(session_id)
        except UnknownSession:
            raise _unknown(session_id, where) from None

    def require_phase(self, session: Session, *allowed: Phase, where: str = "body") -> None:
        """409 naming `id` when the episode is not in a phase that allows the call."""
        if session.phase in allowed:
            return
        reason = {
            Phase.CREATED: "has not been reset yet: POST /reset first",
            Phase.DONE: "finished its episode: POST /reset to start another",
        }.get(session.phase, session.phase)
        raise field_error(409, [where, "id"], f"session {session.id} {reason}", "episode_state")


def create_app(
    env_factory: Callable[[], Environment],
    *,
    env_name: str,
    idle_timeout_s: float = 600.0,
    max_sessions: int = 1024,
    threads: int = 8,
    env_timeout_s: float = 300.0,
    can_render: bool | None = None,
) -> FastAPI:
    """The FastAPI app serving `env_factory`'s environments, one per session.

    Args:
        env_factory: makes one environment instance per session.
        env_name: the registered name, for messages and `/info`.
        idle_timeout_s: sessions unused this long are closed.
        max_sessions: more open sessions than this get 503 on create.
        threads: environment calls running at once.
        env_timeout_s: an environment call this long fails with 504 and drops the session.
        can_render: expose `/render`; None: if the factory's class has `render`.
    """
    store = SessionStore(
        env_factory, threads=threads, max_sessions=max_sessions, env_timeout_s=env_timeout_s
    )
    server = EnvServer(env_name, store, idle_timeout_s)
    if can_render is None:
        can_render = callable(getattr(env_factory, "render", None))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        reaper = asyncio.create_task(server.reaper())
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await server.shutdown()

    app = FastAPI(
        title=f"agentgym env server: {env_name}",
        version=__version__,
        description="AgentGym's environment protocol (Family A, keyed by `id`).",
        lifespan=lifespan,
    )
    app.state.env_server = server
    _session_routes(app, server)
    _play_routes(app, server)
    _meta_routes(app, server, bool(can_render))
    return app


def _session_routes(app: FastAPI, server: EnvServer) -> None:
    store, name = server.store, server.env_name
    session_gone = {404: {"description": "Unknown session id (body names the field)."}}

    @app.post("/create", responses={503: {"description": "Too many open sessions."}})
    async def create(body: CreateRequest | None = None) -> CreateResponse:
        """Open a session with a fresh environment instance."""
        if len(store) >= store.max_sessions:
            return JSONResponse(  # type: ignore[return-value]
                status_code=503,
                headers={"Retry-After": "1"},
                content={
                    "detail": f"{store.max_sessions} sessions are open (max_sessions); "
                    "close some with POST /close or start the server with more"
                },
            )
        try:
            session = await store.create()
        except Exception as error:  # noqa: BLE001 - the env's constructor failed
            _env_failure(name, "creating an instance", error)
        return CreateResponse(id=session.id)

    @app.get("/observation", responses=session_gone)
    async def observation(id: int = Query(ge=0, le=MAX_TASK_ID)) -> ObservationResponse:  # noqa: A002
        """The last observation of session `id` (as BabyAI's server, an object)."""
        session = server.session(id, "query")
        server.require_phase(session, Phase.RUNNING, Phase.DONE, where="query")
        return ObservationResponse(observation=session.observation)

    @app.post("/close", responses=session_gone)
    async def close(body: IdRequest) -> bool:
        """Close session `id` and its environment; answers `true` as AgentGym's servers."""
        try:
            await store.close(body.id)
        except UnknownSession:
            raise _unknown(body.id, "body") from None
        return True


def _play_routes(app: FastAPI, server: EnvServer) -> None:
    store, name = server.store, server.env_name
    session_gone = {404: {"description": "Unknown session id (body names the field)."}}

    @app.post("/reset", responses={**session_gone, 422: {"description": "Bad field."}})
    async def reset(body: ResetRequest) -> ResetResponse:
        """Start episode `data_idx`; allowed in any phase."""
        async with using(server.session(body.id)) as session:
            try:
                observation = await store.call(session.env.reset, body.data_idx)
                actions = await store.call(session.env.valid_actions)
                group = await store.call(session.env.task_group, body.data_idx)
            except (ValueError, KeyError, IndexError) as error:
                session.phase = Phase.CREATED
                raise field_error(
                    422,
                    ["body", "data_idx"],
                    f"{name} cannot reset task {body.data_idx}: {type(error).__name__}: {error}",
                    "invalid_task",
                ) from error
            except Exception as error:  # noqa: BLE001 - reported as a server error
                await _drop_on_timeout(store, session, error)
                _env_failure(name, f"reset({body.data_idx})", error)
            session.phase, session.observation, session.score = Phase.RUNNING, observation, 0.0
            return ResetResponse(
                observation=observation, available_actions=actions, task_group=str(group)
            )

    @app.post("/step", responses={**session_gone, 409: {"description": "Not reset, or done."}})
    async def step(body: StepRequest) -> StepResponse:
        """Apply one action; refused before the first reset and after the episode ended."""
        async with using(server.session(body.id)) as session:
            server.require_phase(session, Phase.RUNNING)
            try:
                result = await store.call(session.env.step, body.action)
                done = bool(result.done or result.truncated)
                actions = None if done else await store.call(session.env.valid_actions)
            except Exception as error:  # noqa: BLE001 - reported as a server error
                session.phase = Phase.CREATED
                await _drop_on_timeout(store, session, error)
                _env_failure(name, "step", error)
            reward = _finite(float(result.reward))
            session.score += reward
            session.observation = result.observation
            session.phase = Phase.DONE if done else Phase.RUNNING
            return StepResponse(
                observation=result.observation,
                reward=reward,
                score=session.score,
                done=bool(result.done),
                truncated=bool(result.truncated),
                available_actions=actions,
                info=jsonable(dict(result.info)),
            )


async def _drop_on_timeout(store: SessionStore, session: Session, error: BaseException) -> None:
    """A timed-out env may still be running in its thread: never reuse it."""
    if isinstance(error, EnvCallTimeout):
        with contextlib.suppress(UnknownSession):
            await store.close(session.id)


def _meta_routes(app: FastAPI, server: EnvServer, can_render: bool) -> None:
    store, name = server.store, server.env_name

    @app.get("/info")
    async def info() -> InfoResponse:
        """What this server serves and how many sessions are open."""
        return InfoResponse(
            env=name,
            version=__version__,
            sessions=len(store),
            max_sessions=store.max_sessions,
            created=store.created,
            closed=store.closed,
            idle_timeout_s=server.idle_timeout_s,
            can_render=can_render,
        )

    @app.get("/tasks")
    async def tasks(split: Literal["train", "test"] = "train") -> TasksResponse:
        """Task ids of a split, so a client need not be told them."""
        env = await server.probe()
        ids = await store.call(env.tasks, split)
        return TasksResponse(split=split, tasks=[int(t) for t in ids])

    @app.get("/instruction")
    async def instruction() -> InstructionResponse:
        """The environment's own instruction prompt."""
        env = await server.probe()
        return InstructionResponse(instruction=await store.call(env.instruction))

    if not can_render:
        return

    @app.get("/render", responses={404: {"description": "Unknown session id."}})
    async def render(id: int = Query(ge=0, le=MAX_TASK_ID)) -> RenderResponse:  # noqa: A002
        """A drawing of session `id`'s current state."""
        async with using(server.session(id, "query")) as session:
            server.require_phase(session, Phase.RUNNING, Phase.DONE, where="query")
            try:
                image = await store.call(session.env.render)  # type: ignore[attr-defined]
            except Exception as error:  # noqa: BLE001 - reported as a server error
                _env_failure(name, "render", error)
            return render_payload(image)
