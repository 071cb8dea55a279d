"""What an outside OpenEnv client and a code review found in `--protocol openenv`, each fixed.

- a 50,000-deep JSON message is INVALID_JSON and the session goes on (it raised RecursionError);
- reset keywords the server does not know are ignored and logged once (they were a 422);
- an env call's timeout starts when a thread runs it, not when it is queued;
- an env built after its caller gave up is closed, and one still queued is never built;
- `/health` fails while no env can be built, and recovers with the factory;
- OpenEnv's client, reconnecting after an idle close, is told why its step comes "before reset".

Small envs of the test's own on real uvicorn servers (127.0.0.1).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

import httpx
import pytest

pytest.importorskip("openenv.core", reason="make installs openenv (docs/openenv.md)")
from openenv.core import GenericEnvClient  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from agentgym_core.serve.openenv import create_openenv_app  # noqa: E402
from agentgym_core.serve.runner import ServerThread  # noqa: E402
from agentgym_core.serve.sessions import EnvCallTimeout, SessionStore  # noqa: E402
from agentgym_core.types import StepResult  # noqa: E402


class Corridor:
    """Walk forward three times to win; records how many of its kind were built and closed."""

    built = 0
    closed = 0

    def __init__(self, build_seconds: float = 0.0) -> None:
        time.sleep(build_seconds)
        type(self).built += 1
        self.position = 0

    def tasks(self, split: str) -> list[int]:
        return [0, 1] if split == "train" else [2]

    def instruction(self) -> str:
        return "Walk to the end of the corridor."

    def task_group(self, task_id: int) -> str:
        return "corridor"

    def reset(self, task_id: int) -> str:
        self.position = 0
        return f"task {task_id}: you are at 0"

    def valid_actions(self) -> list[str]:
        return ["forward"]

    def step(self, action: str) -> StepResult:
        self.position += action == "forward"
        done = self.position >= 3
        return StepResult(f"you are at {self.position}", float(done), done, False, {})

    def close(self) -> None:
        type(self).closed += 1


def _ask(ws: Any, message: Any) -> dict:
    ws.send(message if isinstance(message, str) else json.dumps(message))
    return json.loads(ws.recv(timeout=30))


def _socket(url: str) -> Any:
    return connect(url.replace("http://", "ws://") + "/ws", proxy=None, open_timeout=10)


@pytest.fixture(scope="module")
def corridor():
    with ServerThread(create_openenv_app(Corridor, env_name="corridor")) as server:
        yield server


def test_deeply_nested_json_is_invalid_json_and_the_session_goes_on(corridor):
    deep = "[" * 50_000 + "]" * 50_000
    with _socket(corridor.url) as ws:
        assert _ask(ws, {"type": "reset", "data": {"task_id": 0}})["type"] == "observation"
        reply = _ask(ws, deep)
        assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_JSON", reply
        assert "nested too deeply" in reply["data"]["message"]
        nested_data = '{"type": "step", "data": ' + deep + "}"
        assert _ask(ws, nested_data)["data"]["code"] == "INVALID_JSON"
        stepped = _ask(ws, {"type": "step", "data": {"text": "forward"}})
        assert stepped["type"] == "observation" and "at 1" in stepped["data"]["observation"]["text"]
    refused = httpx.post(
        f"{corridor.url}/reset", content=deep, headers={"content-type": "application/json"}
    )
    assert refused.status_code in (400, 422), refused.text
    assert httpx.get(f"{corridor.url}/health").json() == {"status": "healthy"}


def test_unknown_reset_keywords_are_ignored_and_logged_once(corridor, caplog):
    caplog.set_level(logging.WARNING, logger="agentgym_core.serve.openenv_episodes")
    with _socket(corridor.url) as ws:
        for _ in range(2):
            reply = _ask(ws, {"type": "reset", "data": {"task_id": 1, "difficulty": "hard"}})
            assert reply["type"] == "observation", reply
            observation = reply["data"]["observation"]
            assert observation["task_id"] == 1
            assert observation["metadata"]["ignored_reset_keys"] == ["difficulty"]
    over_http = httpx.post(f"{corridor.url}/reset", json={"task_id": 2, "difficulty": "hard"})
    assert over_http.status_code == 200 and over_http.json()["observation"]["task_id"] == 2
    stepped = httpx.post(
        f"{corridor.url}/step",
        json={"action": {"text": "forward"}, "task_id": 0, "trace_id": "x"},
    )
    assert stepped.status_code == 200, stepped.text
    said = [r.getMessage() for r in caplog.records if "difficulty" in r.getMessage()]
    assert len(said) == 1 and "ignores difficulty" in said[0], said
    plain = httpx.post(f"{corridor.url}/reset", json={"task_id": 0}).json()
    assert "ignored_reset_keys" not in plain["observation"]["metadata"]


def test_an_env_calls_timeout_starts_when_a_thread_runs_it():
    """Two 0.6 s calls on one thread with a 1 s limit: the second waits 0.6 s queued, and passes."""

    async def main() -> None:
        store = SessionStore(Corridor, threads=1, env_timeout_s=1.0)
        try:
            calls = [store.call(time.sleep, 0.6) for _ in range(2)]
            started = time.monotonic()
            await asyncio.gather(*calls)
            assert time.monotonic() - started >= 1.1  # they did queue
            with pytest.raises(EnvCallTimeout, match="took longer than 1.0 s"):
                await store.call(time.sleep, 1.5)
        finally:
            store.executor.shutdown(wait=True)

    asyncio.run(main())


def test_an_env_built_after_its_caller_gave_up_is_closed_and_a_queued_one_never_built():
    class Slow(Corridor):
        built = 0
        closed = 0

        def __init__(self) -> None:
            super().__init__(build_seconds=0.8)

    async def main() -> None:
        store = SessionStore(Slow, threads=1, env_timeout_s=0.2)
        try:
            with pytest.raises(EnvCallTimeout):
                await store.create()
            assert (Slow.built, Slow.closed) == (0, 0)  # still being built
            # a second build waits behind the first; its caller gives up while it is queued
            queued = asyncio.ensure_future(store.build())
            await asyncio.sleep(0.1)
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
            await asyncio.sleep(1.2)
            assert (Slow.built, Slow.closed) == (
                1,
                1,
            )  # the late one closed; the queued, never built
            assert len(store) == 0 and store.factory_error.startswith("EnvCallTimeout")
        finally:
            store.executor.shutdown(wait=True)

    asyncio.run(main())


def test_health_fails_while_no_env_can_be_built_and_recovers():
    working = threading.Event()

    def factory() -> Corridor:
        if not working.is_set():
            raise RuntimeError("the simulator's licence server is down")
        return Corridor()

    with ServerThread(create_openenv_app(factory, env_name="flaky")) as server:
        sick = httpx.get(f"{server.url}/health")
        assert sick.status_code == 503 and sick.json()["status"] == "unhealthy"
        assert "licence server is down" in sick.json()["reason"]
        working.set()
        assert httpx.get(f"{server.url}/health").json() == {"status": "healthy"}
        working.clear()  # a session's env fails to build: unhealthy until one builds again
        with _socket(server.url) as ws:
            assert json.loads(ws.recv(timeout=30))["data"]["code"] == "FACTORY_ERROR"
        assert httpx.get(f"{server.url}/health").status_code == 503
        working.set()
        assert httpx.get(f"{server.url}/health").json() == {"status": "healthy"}


def test_openenvs_client_after_an_idle_close_is_told_its_session_is_new():
    """0.10.0's client reconnects silently after the server closes an idle session."""
    app = create_openenv_app(Corridor, env_name="corridor", idle_timeout_s=0.5)
    with ServerThread(app) as server, GenericEnvClient(base_url=server.url).sync() as client:
        assert client.reset(task_id=0).done is False
        time.sleep(1.5)  # the server closes the session
        with pytest.raises(RuntimeError, match="before reset in this session") as refused:
            client.step({"text": "forward"})
        assert "--idle-timeout 0.5 s" in str(refused.value)
        assert client.reset(task_id=0).done is False  # a reset starts over
        assert client.step({"text": "forward"}).observation["text"] == "you are at 1"
