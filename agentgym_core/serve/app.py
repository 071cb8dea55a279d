"""`agentgym serve-env`: any installed environment over AgentGym's HTTP protocol (Family A).

The routes, bodies and field names are those of AgentGym's BabyAI and
TextCraft servers (`GET /`, `POST /create`, `/reset {id, data_idx}`, `/step
{id, action}`, `/close {id}`, `GET /observation?id=`), so their clients and
ours work unchanged.

Two ways of answering (see `dialects`). By default as AgentGym's server for
the env: refusals are HTTP 200 `{"error": ...}` in AgentGym's words, `/close`
answers `true` then `false`, and the per-env differences (TextCraft resets on
create, keeps stepping after done, answers `/observation` with a string) are
kept. `strict=True` (`--strict`): real status codes with FastAPI's
`{"detail": [{"loc": [...], "msg": ..., "type": ...}]}` body naming the field
(404 unknown id, 409 episode state, 422 task refused, 500 env failure), and
one behaviour for every env. Both modes: 422 for malformed bodies, 503 when
`max_sessions` are open, 504 when an env call passes `env_timeout_s`, 500 with
a `contract_violation` body when an env method returns what the Environment
protocol does not allow, and an `X-AgentGym-Instance` header on every reply
(see `instance`).

Extensions a client may use and AgentGym's ignore: replies carry
`available_actions`, `task_group` and `info`; `GET /info`, `/tasks?split=`,
`/instruction`; `GET /render?id=` when the environment can render.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal, TypeVar

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse

from agentgym_core import __version__
from agentgym_core.interfaces import Environment
from agentgym_core.serve.dialects import (
    ContractViolation,
    EnvError,
    answer,
    dialect_for,
    env_failure,
)
from agentgym_core.serve.instance import InstanceStamp, new_instance
from agentgym_core.serve.models import (
    MAX_TASK_ID,
    CreateRequest,
    CreateResponse,
    DetailResponse,
    ErrorReply,
    IdRequest,
    InfoResponse,
    InstructionResponse,
    ObservationResponse,
    RenderResponse,
    ResetRequest,
    ResetResponse,
    StepRequest,
    StepResponse,
    TasksResponse,
    render_payload,
    request_bodies,
)
from agentgym_core.serve.server import EnvServer
from agentgym_core.serve.sessions import Phase, SessionStore, using

__all__ = ["create_app"]

_Route = TypeVar("_Route", bound=Callable[..., Any])


def create_app(
    env_factory: Callable[[], Environment],
    *,
    env_name: str,
    idle_timeout_s: float = 600.0,
    max_sessions: int = 1024,
    threads: int = 8,
    env_timeout_s: float = 300.0,
    can_render: bool | None = None,
    strict: bool = False,
) -> FastAPI:
    """The FastAPI app serving `env_factory`'s environments, one per session.

    Args:
        env_factory: makes one environment instance per session.
        env_name: the registered name, for messages, `/info`, and which AgentGym server to mimic.
        idle_timeout_s: sessions unused this long are closed.
        max_sessions: more open sessions than this get 503 on create.
        threads: environment calls running at once.
        env_timeout_s: an environment call this long fails with 504 and drops the session.
        can_render: expose `/render`; None: if the factory's class has `render`, or, for a
            factory function, if the environments it makes have (asked of the probe env).
        strict: errors as HTTP status codes instead of AgentGym's 200 `{"error": ...}`.
    """
    store = SessionStore(
        env_factory, threads=threads, max_sessions=max_sessions, env_timeout_s=env_timeout_s
    )
    server = EnvServer(env_name, store, idle_timeout_s, dialect_for(env_name, strict=strict))
    if can_render is None and isinstance(env_factory, type):
        can_render = has_render(env_factory)

    mode = "strict status codes" if strict else "AgentGym's answers: errors are 200 {error}"
    app = FastAPI(
        title=f"agentgym env server: {env_name}",
        version=__version__,
        description=f"AgentGym's environment protocol (Family A, keyed by `id`); {mode}.",
        lifespan=_lifespan(server),
    )
    app.state.env_server = server

    async def on_env_error(_: Request, error: EnvError) -> JSONResponse:
        return answer(error, strict)

    async def on_violation(_: Request, error: ContractViolation) -> JSONResponse:
        return error.response()

    app.add_exception_handler(EnvError, on_env_error)
    app.add_exception_handler(ContractViolation, on_violation)
    app.add_middleware(InstanceStamp, server=server)
    _session_routes(app, server)
    _play_routes(app, server)
    _meta_routes(app, server, can_render)
    return app


def _lifespan(server: EnvServer) -> Callable[[FastAPI], Any]:
    """Reap idle sessions while serving; close every session on shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        server.instance = new_instance()  # a new life: no session of the last one is here
        reaper = asyncio.create_task(server.reaper())
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await server.shutdown()

    return lifespan


def _reply(server: EnvServer, model: Any) -> Any:
    """A route's reply schema: `model`, or `model` or AgentGym's error body when not strict."""
    return model if server.dialect.strict else model | ErrorReply


def _body(model: type[Any]) -> Callable[[_Route], _Route]:
    """Give a route's `body` parameter this mode's model (a subclass of the annotated one)."""

    def declare(route: _Route) -> _Route:
        route.__annotations__["body"] = model
        return route

    return declare


def _id_query(server: EnvServer) -> Any:
    """The `?id=` parameter: bounded when strict, any integer as AgentGym's servers take."""
    return Query(ge=0, le=MAX_TASK_ID) if server.dialect.strict else Query()


def _refusals(server: EnvServer, codes: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """OpenAPI notes of the status codes a route answers in strict mode (else 200 errors)."""
    if not server.dialect.strict:
        return {}
    return {code: {"description": text} for code, text in codes.items()}


def _session_routes(app: FastAPI, server: EnvServer) -> None:
    store, bodies = server.store, request_bodies(server.dialect.strict)
    gone = "Unknown session id (the body names the field)."

    @app.get("/")
    async def hello() -> str:
        """AgentGym's greeting, e.g. `"This is environment BabyAI."`."""
        return server.dialect.greeting

    @app.post(
        "/create",
        response_model=_reply(server, CreateResponse),
        responses={503: {"description": "Too many open sessions."}},
    )
    async def create(body: CreateRequest | None = None) -> Any:
        """Open a session with a fresh environment instance (TextCraft's: reset already)."""
        if len(store) >= store.max_sessions:
            return JSONResponse(
                status_code=503,
                headers={"Retry-After": "1"},
                content={
                    "detail": f"{store.max_sessions} sessions are open (max_sessions); "
                    "close some with POST /close or start the server with more"
                },
            )
        session, observation = await server.create()
        return CreateResponse(id=session.id, observation=observation)

    observed = str if server.dialect.bare_observation else ObservationResponse

    @app.get(
        "/observation",
        response_model=_reply(server, observed),
        responses=_refusals(server, {404: gone, 409: "Not reset yet."}),
    )
    async def observation(id: int = _id_query(server)) -> Any:  # noqa: A002
        """The last observation of session `id` (TextCraft's and SciWorld's: a bare string)."""
        session = server.session(id, "query")
        server.require_phase(session, Phase.RUNNING, Phase.DONE, where="query")
        return server.observation(session)

    @app.post("/close", responses=_refusals(server, {404: gone}))
    @_body(bodies.close)
    async def close(body: IdRequest) -> bool:
        """Close session `id`: `true`, then `false` for a closed or unknown id (404 if strict)."""
        return await server.close(body.id)

    if server.dialect.has_detail:

        @app.get("/detail", response_model=_reply(server, DetailResponse))
        async def detail(id: int = _id_query(server)) -> Any:  # noqa: A002
            """TextCraft's: the last reply of session `id` (`observation`, `done`, `reward`)."""
            return server.detail(server.session(id, "query"))


def _play_routes(app: FastAPI, server: EnvServer) -> None:
    bodies = request_bodies(server.dialect.strict)
    gone = "Unknown session id (the body names the field)."

    @app.post(
        "/reset",
        response_model=_reply(server, ResetResponse),
        responses=_refusals(server, {404: gone, 422: "A bad field, or a task the env refuses."}),
    )
    @_body(bodies.reset)
    async def reset(body: ResetRequest) -> Any:
        """Start episode `data_idx`; allowed in any phase."""
        async with using(server.session(body.id)) as session:
            return await server.reset(session, body.data_idx)

    @app.post(
        "/step",
        response_model=_reply(server, StepResponse),
        responses=_refusals(server, {404: gone, 409: "Not reset, or done."}),
    )
    @_body(bodies.step)
    async def step(body: StepRequest) -> Any:
        """Apply one action; refused before the first reset and (but TextCraft's) after done."""
        async with using(server.session(body.id)) as session:
            server.require_phase(session, *server.dialect.step_phases())
            return await server.play(session, body.action)


def has_render(env_or_class: Any) -> bool:
    """Whether an environment (or its class) draws itself: the optional `render()`."""
    return callable(getattr(env_or_class, "render", None))


def _meta_routes(app: FastAPI, server: EnvServer, can_render: bool | None) -> None:
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
            can_render=has_render(await server.probe()) if can_render is None else can_render,
            strict=server.dialect.strict,
            instance=server.instance,
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
        return InstructionResponse(instruction=await server.instruction())

    if can_render is False:
        return

    @app.get(
        "/render",
        response_model=_reply(server, RenderResponse),
        responses=_refusals(server, {404: "Unknown session id, or an env without render()."}),
    )
    async def render(id: int = _id_query(server)) -> Any:  # noqa: A002
        """A drawing of session `id`'s current state."""
        async with using(server.session(id, "query")) as session:
            server.require_phase(session, Phase.RUNNING, Phase.DONE, where="query")
            if not has_render(session.env):
                raise EnvError(404, f"environment {name} cannot render: it has no render()")
            try:
                image = await store.call(session.env.render)  # type: ignore[attr-defined]
            except Exception as error:  # noqa: BLE001 - reported as a server error
                env_failure(name, "render", error)
            return render_payload(image)
