"""Run an env server: in the foreground (`agentgym serve-env`) or in a thread (tests, benches)."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from typing import Any

DEFAULT_HOST = "127.0.0.1"
"""Loopback unless told otherwise: an env server runs code on request, keep it private."""


def build_app(
    host_registry: Any,
    env_name: str,
    options: dict[str, Any] | None = None,
    *,
    env_option_pairs: Any = None,
    protocol: str = "agentgym",
    step_latency_s: float = 0.0,
    **app_options: Any,
) -> Any:
    """The FastAPI app of a registered environment, its options validated by the plugin's model.

    `protocol` is `agentgym` (AgentGym's HTTP protocol, `serve.app`) or
    `openenv` (OpenEnv's, `serve.openenv`). Bad options raise a `ConfigError`
    naming `env.<key>` (and the `--env-option` pair it came from, when
    `env_option_pairs` are given). `step_latency_s` is added to every reset and
    step, to rehearse a slow env.
    """
    from agentgym_core.env_options import validate_env_options
    from agentgym_core.serve.app import create_app, has_render

    registration, config = validate_env_options(
        host_registry, env_name, options or {}, env_option_pairs
    )

    def factory() -> Any:
        from agentgym_core.rollout import contract

        env = contract.label(registration.factory(config), registration.name)
        return Delayed(env, step_latency_s) if step_latency_s > 0 else env

    if protocol == "openenv":
        from agentgym_core.serve.openenv import create_openenv_app

        return create_openenv_app(factory, env_name=env_name, **app_options)
    if protocol != "agentgym":
        raise ValueError(f"unknown protocol {protocol!r}; protocols: agentgym, openenv")
    if "can_render" not in app_options and isinstance(registration.factory, type):
        app_options["can_render"] = has_render(registration.factory)
    return create_app(factory, env_name=env_name, **app_options)


class Delayed:
    """An env whose reset and step each take `seconds` longer (a sleep, no CPU)."""

    def __init__(self, env: Any, seconds: float) -> None:
        self._env, self._seconds = env, seconds

    def reset(self, task_id: Any) -> str:
        """The env's reset, after the delay."""
        time.sleep(self._seconds)
        return self._env.reset(task_id)

    def step(self, action: str) -> Any:
        """The env's step, after the delay."""
        time.sleep(self._seconds)
        return self._env.step(action)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)


def bind(host: str = DEFAULT_HOST, port: int = 0) -> socket.socket:
    """A listening TCP socket (port 0: a free one), reusable right after a restart."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


IDLE_REUSE_S = 2.0
"""How long our HTTP clients (env pool, vLLM and OpenAI-endpoint policies) reuse an idle
kept-alive connection: well under uvicorn's 5 s default (AgentGym's servers, `vllm serve`),
after which it drops idle ones; a request sent on one it is dropping fails like an outage."""
KEEP_ALIVE_S = 75
"""How long our servers keep an idle client connection: longer than clients reuse one
(`IDLE_REUSE_S`, httpx's default 5 s), so no request rides a connection being closed."""


class ServerThread:
    """A real uvicorn server on a loopback port, in a background thread.

    `with ServerThread(app) as server: httpx.get(server.url + "/info")`. The
    port may be given (to restart a server where it was); 0 picks a free one.
    """

    def __init__(
        self, app: Any, *, host: str = DEFAULT_HOST, port: int = 0, log_level: str = "warning"
    ) -> None:
        import uvicorn

        self._sock = bind(host, port)
        self.host, self.port = host, self._sock.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_level=log_level,
            lifespan="on",
            timeout_graceful_shutdown=5,
            timeout_keep_alive=KEEP_ALIVE_S,
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        """Base URL, e.g. `http://127.0.0.1:36001`."""
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 20.0) -> ServerThread:
        """Start serving; returns once the server accepts connections."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"env server on {self.url} did not start")
            time.sleep(0.02)
        return self

    def stop(self, timeout_s: float = 20.0) -> None:
        """Shut down (closes every session) and release the port."""
        self.server.should_exit = True
        self._thread.join(timeout_s)
        self._sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


GRACEFUL_SHUTDOWN_S = 5
"""On SIGTERM/SIGINT, how long requests in flight may finish before they are cancelled."""


def serve(app: Any, host: str = DEFAULT_HOST, port: int = 36001, log_level: str = "info") -> None:
    """Serve in the foreground until interrupted (SIGINT, SIGTERM).

    Requests in flight get `GRACEFUL_SHUTDOWN_S` to finish, open sessions a
    moment to close. An env call that never returns cannot be stopped (it runs
    in a thread) and Python waits for every pool thread at exit, so the process
    then exits without waiting (the app's shutdown says so in one line).
    """
    import uvicorn

    code = 0
    try:
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level=log_level,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            timeout_keep_alive=KEEP_ALIVE_S,
        )
    except KeyboardInterrupt:  # uvicorn raises SIGINT again once it has shut down
        code = 130
        raise
    finally:
        server = getattr(app.state, "env_server", None)
        if server is not None and server.store.running:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
