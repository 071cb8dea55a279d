"""`agentgym serve-env NAME --protocol openenv`: any installed environment as an OpenEnv server.

OpenEnv (the `openenv` package) is the env interface TRL's GRPOTrainer and SkyRL
consume. Its plain HTTP `/reset` and `/step` make a fresh
environment per request, so a multi-turn episode lives in a WebSocket
session on `/ws`: one connection, one environment instance, messages
`{"type": "reset" | "step" | "state" | "close", "data": {...}}`, answered by
`{"type": "observation" | "state" | "error", "data": {...}}`.

Served here: `/ws`; `POST /reset` and `POST /step` (stateless: `/step`
names the task to reset to before its one step); `GET /state`, `/schema`,
`/metadata`, `/health`; `POST /mcp` (JSON-RPC, no tools); and `GET
/tasks?split=` (ours: the task ids, for clients that choose tasks). Sessions
are bounded by `max_sessions` (more get CAPACITY_REACHED), a session idle for
`idle_timeout_s` is closed, and every env call runs in the server's thread
pool bounded by `env_timeout_s` (counted from when a thread runs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from fastapi import FastAPI, HTTPException, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from agentgym_core import __version__
from agentgym_core.interfaces import Environment
from agentgym_core.serve.openenv_episodes import Episode, OpenEnvError, OpenEnvServer
from agentgym_core.serve.openenv_models import (
    EpisodeState,
    ErrorCode,
    Metadata,
    ResetBody,
    ResetOptions,
    StepBody,
    TextAction,
    TextObservation,
    envelope,
)
from agentgym_core.serve.sessions import Session, SessionStore

__all__ = ["create_openenv_app"]

REFUSAL_WAIT_S = 10.0
"""A session refused for capacity waits this long for the client's first message to answer."""


def create_openenv_app(
    env_factory: Callable[[], Environment],
    *,
    env_name: str,
    idle_timeout_s: float = 600.0,
    max_sessions: int = 1024,
    threads: int = 8,
    env_timeout_s: float = 300.0,
) -> FastAPI:
    """The FastAPI app serving `env_factory`'s environments over OpenEnv's protocol.

    Args:
        env_factory: makes one environment instance per `/ws` session (and per HTTP call).
        env_name: the registered name, for messages and `/metadata`.
        idle_timeout_s: a session that sends nothing this long is closed.
        max_sessions: more `/ws` sessions than this get CAPACITY_REACHED.
        threads: environment calls running at once.
        env_timeout_s: an env call this long fails, and ends its session.
    """
    store = SessionStore(
        env_factory, threads=threads, max_sessions=max_sessions, env_timeout_s=env_timeout_s
    )
    server = OpenEnvServer(env_name, store, idle_timeout_s)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await server.close_probe()
            await store.close_all()

    app = FastAPI(
        title=f"agentgym env server: {env_name} (OpenEnv)",
        version=__version__,
        description="OpenEnv's protocol: WebSocket sessions on /ws, stateless /reset and /step.",
        lifespan=lifespan,
    )
    app.state.env_server = server  # `runner.serve` reads its store at exit
    _http_routes(app, server)
    _ws_route(app, server)
    return app


@contextlib.asynccontextmanager
async def _one_off(server: OpenEnvServer) -> AsyncIterator[Session]:
    """A fresh environment for one HTTP call (OpenEnv's stateless routes), closed after."""
    store = server.store
    try:
        env = await store.build()
    except Exception as error:  # noqa: BLE001 - the env's constructor failed
        raise _http(
            OpenEnvError(ErrorCode.FACTORY_ERROR, f"creating {server.env_name}: {error}", 500)
        ) from error
    try:
        yield Session(-1, env)
    finally:
        with contextlib.suppress(Exception):
            await store.call(env.close)


def _http(error: OpenEnvError) -> HTTPException:
    detail: dict[str, Any] = {"message": str(error), "code": error.code.value, **error.extra}
    return HTTPException(error.status, detail=detail)


def _http_routes(app: FastAPI, server: OpenEnvServer) -> None:
    @app.post("/reset")
    async def reset(body: ResetBody | None = None) -> dict[str, Any]:
        """Reset a fresh environment and return its first observation (it is then closed)."""
        async with _one_off(server) as session:
            try:
                observation = await server.reset(session, Episode(), body or ResetBody())
            except OpenEnvError as error:
                raise _http(error) from error
        return envelope(observation)

    @app.post("/step")
    async def step(body: StepBody) -> dict[str, Any]:
        """One step of a fresh environment, reset first to the task the body names.

        Stateless, as OpenEnv's: a multi-turn episode needs the `/ws` session.
        """
        options = body.reset_options()
        if options.task_id is None and options.split is None and options.seed is None:
            raise HTTPException(
                422,
                detail={
                    "message": "POST /step is stateless (a fresh env per request): name the "
                    "task to step in (task_id, or split and index, or seed), or play "
                    "multi-turn episodes over the /ws session",
                    "code": ErrorCode.VALIDATION_ERROR.value,
                },
            )
        async with _one_off(server) as session:
            episode = Episode()
            try:
                await server.reset(session, episode, options)
                observation = await server.step(session, episode, body.action)
            except OpenEnvError as error:
                raise _http(error) from error
        return envelope(observation)

    @app.get("/state")
    async def state() -> EpisodeState:
        """The state of a fresh environment (no episode): state lives in `/ws` sessions."""
        return Episode().state()

    @app.get("/schema")
    async def schema() -> dict[str, Any]:
        """JSON schemas of the action, the observation and the state."""
        return {
            "action": TextAction.model_json_schema(),
            "observation": TextObservation.model_json_schema(),
            "state": EpisodeState.model_json_schema(),
        }

    @app.get("/metadata")
    async def metadata() -> Metadata:
        """The env's name, version, and its instruction prompt as the description."""
        try:
            instruction = await server.instruction(await server.probe())
        except OpenEnvError as error:
            raise _http(error) from error
        return Metadata(
            name=server.env_name,
            description=instruction,
            version=__version__,
        )

    @app.get("/health", response_model=None)
    async def health() -> dict[str, str] | JSONResponse:
        """OpenEnv's health check: unhealthy (503) while no environment can be built."""
        problem = await server.health_problem()
        if problem is not None:
            return JSONResponse({"status": "unhealthy", "reason": problem}, status_code=503)
        return {"status": "healthy"}

    @app.post("/mcp")
    async def mcp(request: Request) -> dict[str, Any]:
        """OpenEnv's JSON-RPC 2.0 endpoint for MCP tools: ours has none, and says so."""
        return _mcp_reply(await request.body())

    @app.get("/tasks")
    async def tasks(split: Literal["train", "test"] = "train") -> dict[str, Any]:
        """Ours, not OpenEnv's: the task ids of a split, for clients that choose tasks."""
        try:
            ids = await server.task_ids(await server.probe(), split)
        except OpenEnvError as error:
            raise _http(error) from error
        return {"split": split, "tasks": ids}


def _mcp_reply(body: bytes) -> dict[str, Any]:
    """The JSON-RPC error every `/mcp` request gets (`openenv validate --url` checks its shape)."""
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        return _jsonrpc_error(None, -32700, "Parse error")
    if not isinstance(request, dict) or request.get("jsonrpc") != "2.0" or "method" not in request:
        return _jsonrpc_error(None, -32600, 'Invalid request: give "jsonrpc": "2.0" and a method')
    return _jsonrpc_error(
        request.get("id"),
        -32601,
        f"Method not found: {request['method']!r}. This env has no MCP tools: play its "
        "episodes over the /ws session (reset, then step with an action's text)",
    )


def _jsonrpc_error(request_id: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


def _ws_route(app: FastAPI, server: OpenEnvServer) -> None:
    store = server.store

    @app.websocket("/ws")
    async def session_socket(websocket: WebSocket) -> None:
        """One session: one environment instance for the life of the connection."""
        await websocket.accept()
        if server.sessions >= store.max_sessions:
            # answered as the reply to the client's first message, which it then reads
            with contextlib.suppress(Exception):
                async with asyncio.timeout(REFUSAL_WAIT_S):  # not wait_for: see SessionStore.call
                    await websocket.receive_text()
            await _send_error(
                websocket,
                OpenEnvError(
                    ErrorCode.CAPACITY_REACHED,
                    f"{store.max_sessions} sessions are open (--max-sessions); "
                    "close one or retry later",
                    503,
                    active_sessions=server.sessions,
                    max_sessions=store.max_sessions,
                ),
            )
            return
        server.sessions += 1  # counted before the first await: the bound holds under a rush
        try:
            await _session(websocket, server)
        finally:
            server.sessions -= 1


async def _session(websocket: WebSocket, server: OpenEnvServer) -> None:
    """Make the session's environment, serve it, and close both."""
    store = server.store
    try:
        session = await store.create()
    except Exception as error:  # noqa: BLE001 - the env's constructor failed
        await _send_error(
            websocket,
            OpenEnvError(
                ErrorCode.FACTORY_ERROR,
                f"creating {server.env_name}: {type(error).__name__}: {error}",
                500,
                factory_name=server.env_name,
            ),
        )
        return
    try:
        await _serve_session(websocket, server, session)
    except WebSocketDisconnect:
        pass
    finally:
        with contextlib.suppress(Exception):
            await store.close(session.id)
        with contextlib.suppress(Exception):
            await websocket.close()


async def _send_error(websocket: WebSocket, error: OpenEnvError) -> None:
    with contextlib.suppress(Exception):
        await websocket.send_json(error.ws_message())
        await websocket.close()


async def _serve_session(websocket: WebSocket, server: OpenEnvServer, session: Session) -> None:
    """Answer one message at a time until `close`, a disconnect, idleness or a stuck env."""
    episode = Episode()
    while True:
        try:
            # not wait_for: see SessionStore.call
            async with asyncio.timeout(server.idle_timeout_s):
                raw = await _receive(websocket)
        except TimeoutError:
            await _send_error(
                websocket,
                OpenEnvError(
                    ErrorCode.SESSION_ERROR,
                    f"session idle for {server.idle_timeout_s:g} s (--idle-timeout): closed",
                    408,
                ),
            )
            return
        try:
            reply = await _answer(server, session, episode, raw)
        except OpenEnvError as error:
            await websocket.send_json(error.ws_message())
            if error.ends_session:
                with contextlib.suppress(Exception):
                    await websocket.close()
                return
            continue
        if reply is None:  # close
            return
        await websocket.send_json(reply)


async def _receive(websocket: WebSocket) -> str:
    """The next message as text (a binary frame is decoded as UTF-8, as a client may send)."""
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    if message.get("text") is not None:
        return message["text"]
    return (message.get("bytes") or b"").decode("utf-8", errors="replace")


async def _answer(
    server: OpenEnvServer, session: Session, episode: Episode, raw: str
) -> dict[str, Any] | None:
    """The reply to one `/ws` message (None for `close`); refusals raise `OpenEnvError`."""
    try:
        message = json.loads(raw)
    except json.JSONDecodeError as error:
        raise OpenEnvError(ErrorCode.INVALID_JSON, f"Invalid JSON: {error}", 400) from error
    except RecursionError:  # nesting deeper than Python's stack: refused, not a crash
        raise OpenEnvError(ErrorCode.INVALID_JSON, "Invalid JSON: nested too deeply", 400) from None
    kind = message.get("type") if isinstance(message, dict) else None
    data = message.get("data", {}) if isinstance(message, dict) else None
    if kind not in ("reset", "step", "state", "close"):
        raise OpenEnvError(
            ErrorCode.UNKNOWN_TYPE,
            f"Unknown message type: {kind!r}; types: reset, step, state, close",
            400,
        )
    if kind == "close":
        return None
    if kind == "state":
        return {"type": "state", "data": episode.state().model_dump()}
    try:
        if kind == "reset":
            options = ResetOptions.model_validate(data if data is not None else {})
        else:
            action = TextAction.model_validate(data)
    except ValidationError as error:
        raise OpenEnvError(
            ErrorCode.VALIDATION_ERROR,
            f"Invalid {kind} data: {_first_error(error)}",
            422,
            errors=json.loads(error.json(include_url=False, include_input=False)),
        ) from error
    async with session.lock:
        if kind == "reset":
            observation = await server.reset(session, episode, options)
        else:
            observation = await server.step(session, episode, action)
    return {"type": "observation", "data": envelope(observation)}


def _first_error(error: ValidationError) -> str:
    first = error.errors(include_url=False)[0]
    where = ".".join(str(part) for part in first["loc"]) or "data"
    return f"{where}: {first['msg']}"
