"""Server restarts that no request notices, and a server stopped while an env call hangs.

A restart quick enough that no request fails must not let an episode go on in
an id that now belongs to someone else: `serve-env` names its life in an
`X-AgentGym-Instance` header (and refuses calls meant for another life); the
`remote` env checks it on every call, and against AgentGym's servers (ids from
0 again, no header) it notices an id handed out again while it still holds it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from typing import Annotated, Any

import httpx
import pytest
from fastapi import Body, FastAPI

from agentgym_core.serve import ServerThread, create_app
from agentgym_core.serve import sessions as serve_sessions
from agentgym_core.types import StepResult

pytest.importorskip("agentgym_env_remote")

from agentgym_env_remote import RemoteConfig, RemoteEnv, ServerRestarted, SessionLost  # noqa: E402

HEADER = "X-AgentGym-Instance"


class _CountEnv:
    """Task t starts at `t`; each step adds one; 'stop' ends the episode."""

    def tasks(self, split: str) -> list[int]:
        return [0, 1, 2] if split == "train" else [9]

    def instruction(self) -> str:
        return "Count."

    def reset(self, task_id: int) -> str:
        self.count = task_id
        return f"at {self.count}"

    def step(self, action: str) -> StepResult:
        self.count += 1
        return StepResult(f"at {self.count}", 0.0, action == "stop")

    def valid_actions(self) -> list[str]:
        return ["up", "stop"]

    def task_group(self, task_id: int) -> str:
        return "all"

    def close(self) -> None:
        pass


def _remote(url: str, env: str = "agentgym") -> RemoteEnv:
    config = RemoteConfig(env=env, base_urls=[url], train_tasks=[0, 1, 2], test_tasks=[9])
    return RemoteEnv(config)


@pytest.fixture
def ids_from_zero(monkeypatch):
    """Session ids from 0 in every server life, as AgentGym's servers hand them out."""

    class Zero:
        @staticmethod
        def randbelow(_: int) -> int:
            return 0

    monkeypatch.setattr(serve_sessions, "secrets", Zero)


# -- serve-env: the instance header ------------------------------------------------------------


def test_every_reply_names_the_server_life_and_a_restart_changes_it():
    first = ServerThread(create_app(_CountEnv, env_name="count")).start()
    try:
        hello = httpx.get(first.url + "/")
        instance = hello.headers[HEADER]
        assert len(instance) == 16 and hello.json() == "This is environment count."
        refused = httpx.post(first.url + "/step", json={"id": 1, "action": "up"})
        assert refused.headers[HEADER] == instance  # error replies too
        assert httpx.get(first.url + "/info").json()["instance"] == instance
    finally:
        first.stop()
    with ServerThread(create_app(_CountEnv, env_name="count"), port=first.port) as second:
        assert httpx.get(second.url + "/").headers[HEADER] != instance


@pytest.mark.parametrize("strict", [False, True], ids=["agentgym", "strict"])
def test_a_call_meant_for_another_life_is_refused_and_touches_nothing(strict):
    app = create_app(_CountEnv, env_name="count", strict=strict)
    with ServerThread(app) as server, httpx.Client(base_url=server.url) as http:
        sid = http.post("/create").json()["id"]
        instance = http.post("/reset", json={"id": sid, "data_idx": 0}).headers[HEADER]
        old = {HEADER: "0123456789abcdef"}
        refused = http.post("/step", json={"id": sid, "action": "up"}, headers=old)
        if strict:
            assert refused.status_code == 409
            assert refused.json()["detail"][0]["type"] == "instance_mismatch"
        else:
            assert refused.status_code == 200 and "restarted" in refused.json()["error"]
        assert refused.headers[HEADER] == instance
        mine = {HEADER: instance}
        assert http.get("/observation", params={"id": sid}).json()["observation"] == "at 0"
        step = http.post("/step", json={"id": sid, "action": "up"}, headers=mine)
        assert step.json()["observation"] == "at 1"


def test_fast_restart_of_serve_env_cannot_splice_an_episode(ids_from_zero, caplog):
    first = ServerThread(create_app(_CountEnv, env_name="count")).start()
    remote = _remote(first.url)
    try:
        assert remote.reset(0) == "at 0"
        stale_id = remote.env_id
        first.stop()  # a quick restart: the remote env sends nothing meanwhile
        app = create_app(_CountEnv, env_name="count")
        with (
            ServerThread(app, port=first.port) as second,
            httpx.Client(base_url=second.url) as other,
        ):
            # another client (AgentGym's own, say) now holds the same session id
            assert other.post("/create").json()["id"] == stale_id
            other.post("/reset", json={"id": stale_id, "data_idx": 2})
            with caplog.at_level(logging.WARNING), pytest.raises(ServerRestarted):
                remote.step("up")
            # the other client's episode was not stepped by ours
            observed = other.get("/observation", params={"id": stale_id}).json()
            assert observed["observation"] == "at 2"
            assert remote.pool.restarts() == {second.url: 1}
            assert "restarted" in caplog.text and second.url in caplog.text
            assert remote.reset(1) == "at 1"  # and the env recovers on a fresh id
            assert remote.step("up").observation == "at 2"
    finally:
        remote.close()
        first.stop()


# -- AgentGym's servers: ids from 0 again, no header --------------------------------------------


class _AgentGymLikeServer:
    """Ids from 0, errors as 200 `{"error"}`, BabyAI's reply shapes; `restart()` forgets all."""

    def __init__(self) -> None:
        self.envs: dict[int, _CountEnv] = {}
        self.ids = itertools.count()
        self.lock = threading.Lock()

    def restart(self) -> None:
        with self.lock:
            self.envs.clear()
            self.ids = itertools.count()

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/create")
        def create() -> dict:
            with self.lock:
                env_id = next(self.ids)
                self.envs[env_id] = _CountEnv()
            return {"id": env_id}

        @app.post("/reset")
        def reset(body: Annotated[dict, Body()]) -> dict:
            env = self.envs.get(body["id"])
            if env is None:
                return {"error": f"The id {body['id']} is not valid."}
            return {"observation": env.reset(body["data_idx"]), "reward": 0, "score": 0}

        @app.post("/step")
        def step(body: Annotated[dict, Body()]) -> dict:
            env = self.envs.get(body["id"])
            if env is None:
                return {"error": f"The id {body['id']} is not valid."}
            result = env.step(body["action"])
            return {"observation": result.observation, "reward": 0, "score": 0, "done": False}

        @app.post("/close")
        def close(body: Annotated[dict, Body()]) -> bool:
            with self.lock:
                return self.envs.pop(body["id"], None) is not None

        return app


def test_fast_restart_of_an_agentgym_server_is_caught_when_a_held_id_comes_back():
    server = _AgentGymLikeServer()
    with ServerThread(server.app()) as http:
        a, b, c = (_remote(http.url, "babyai") for _ in range(3))
        try:
            assert a.reset(0) == "at 0" and b.reset(1) == "at 1"
            assert (a.env_id, b.env_id) == (0, 1)
            server.restart()  # no request of a or b failed
            assert c.reset(2) == "at 2" and c.env_id == 0  # a's id, handed out again
            with pytest.raises(SessionLost, match="restarted"):
                a.step("up")  # refused before it is sent: c's episode is not a's
            assert c.step("up").observation == "at 3"
            with pytest.raises(SessionLost):
                b.step("up")
            assert a.pool.restarts() == {http.url: 1}
        finally:
            a.close(), b.close(), c.close()


def test_servers_that_draw_ids_at_random_are_not_taken_for_restarted():
    server = _AgentGymLikeServer()
    with ServerThread(server.app()) as http:
        config = {"env": "webshop", "base_urls": [http.url], "train_tasks": [0]}
        a = RemoteEnv(RemoteConfig(**config, test_tasks=[9]))
        try:
            a._ensure_id()  # WebShop's and SQLGym's servers may hand one id to two clients
            server.ids = itertools.count()
            b = RemoteEnv(RemoteConfig(**config, test_tasks=[9]))
            b._ensure_id()
            assert a.env_id == b.env_id == 0 and a.pool.restarts() == {http.url: 0}
            b.close()
        finally:
            a.close()


# -- stopping a server while an env call never returns -----------------------------------------

STUCK_SERVER = """
import pathlib, sys, threading
from agentgym_core.serve.app import create_app
from agentgym_core.serve.runner import serve
from agentgym_core.types import StepResult

LOCK = threading.Lock()

class StuckEnv:
    def tasks(self, split): return [0]
    def instruction(self): return "wait"
    def reset(self, task_id): return "ready"
    def valid_actions(self): return None
    def task_group(self, task_id): return "all"
    def step(self, action):
        with LOCK:  # and never lets go
            pathlib.Path(sys.argv[2]).touch()  # tells the test the step is in the env now
            threading.Event().wait()
    def close(self):
        with LOCK:
            pass

serve(create_app(StuckEnv, env_name="stuck"), port=int(sys.argv[1]), log_level="warning")
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stop_with_a_stuck_env_call_exits_within_seconds_and_says_so(tmp_path, sig):
    script = tmp_path / "serve_stuck.py"
    script.write_text(textwrap.dedent(STUCK_SERVER))
    port = _free_port()
    stepping = tmp_path / "stepping"
    process = subprocess.Popen(
        [sys.executable, str(script), str(port), str(stepping)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(base + "/", timeout=1)
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, "did not start"
                time.sleep(0.1)
        sid = httpx.post(base + "/create").json()["id"]
        httpx.post(base + "/reset", json={"id": sid, "data_idx": 0})

        def hang() -> Any:  # answered only when the server gives up on it, if at all
            with contextlib.suppress(httpx.HTTPError):
                httpx.post(base + "/step", json={"id": sid, "action": "wait"}, timeout=60)

        threading.Thread(target=hang, daemon=True).start()
        deadline = time.monotonic() + 60
        while not stepping.exists():  # the step is in the env, holding its lock
            assert time.monotonic() < deadline, "the step never reached the env"
            time.sleep(0.05)
        started = time.monotonic()
        process.send_signal(sig)
        output, _ = process.communicate(timeout=20)  # before: SIGINT never exits
        took = time.monotonic() - started
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert took < 12, f"took {took:.1f} s"
    said = [line for line in output.splitlines() if "still running" in line]
    assert len(said) == 1 and "serve-env stuck" in said[0], output[-2000:]
