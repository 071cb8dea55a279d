"""`agentgym serve-env --protocol openenv` on real uvicorn servers, played by OpenEnv's own clients.

Parity: `openenv`'s `GenericEnvClient` and a typed `EnvClient` (built on
OpenEnv's `Observation` model, which forbids unknown fields) play whole
BabyAI and TextCraft episodes with the same observations, rewards and ends
as in-process. Bad input gets OpenEnv-shaped errors, never a crash or hang.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

pytest.importorskip("openenv.core", reason="make installs openenv (docs/openenv.md)")
pytest.importorskip("agentgym_env_babyai")

from openenv.core import EnvClient, GenericEnvClient  # noqa: E402
from openenv.core.client_types import StepResult as OpenEnvStep  # noqa: E402
from openenv.core.env_server.types import Observation, State  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from agentgym_core.plugins import PluginHost  # noqa: E402
from agentgym_core.serve import ServerThread, build_app  # noqa: E402
from agentgym_core.serve.openenv_models import MAX_ACTION_CHARS  # noqa: E402

BABYAI = {"levels": ["GoToObj", "OpenDoor", "PickupDist"]}


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return PluginHost()


@pytest.fixture(scope="module")
def babyai(host):
    app = build_app(host.registry, "babyai", BABYAI, protocol="openenv", max_sessions=64)
    with ServerThread(app) as server:
        yield server


def _local(host, name, options):
    registration = host.registry.get("environment", name)
    return registration.factory(registration.config.model_validate(options))


class TextObservation(Observation):
    """What a TRL or SkyRL user would write from our `/schema`, on OpenEnv's base model."""

    text: str
    available_actions: list[str] | None = None
    task_id: int | None = None
    task_group: str | None = None


class TypedClient(EnvClient[dict, TextObservation, State]):
    def _step_payload(self, action: dict) -> dict:
        return action

    def _parse_result(self, payload: dict) -> OpenEnvStep[TextObservation]:
        observation = TextObservation(
            **payload["observation"], reward=payload.get("reward"), done=payload["done"]
        )
        return OpenEnvStep(
            observation=observation, reward=payload.get("reward"), done=payload["done"]
        )

    def _parse_state(self, payload: dict) -> State:
        return State(**payload)


def _play_both(client, local, task: int, max_steps: int = 40) -> int:
    """The expert's actions through the client and in-process; every reply must match."""
    result = client.reset(task_id=task)
    text = lambda o: o["text"] if isinstance(o, dict) else o.text  # noqa: E731
    actions = lambda o: o["available_actions"] if isinstance(o, dict) else o.available_actions  # noqa: E731
    assert text(result.observation) == local.reset(task)
    for step in range(1, max_steps + 1):
        assert actions(result.observation) == local.valid_actions()
        action = local.expert_action()
        result, ours = client.step({"text": action}), local.step(action)
        assert text(result.observation) == ours.observation
        assert (result.reward, result.done) == (ours.reward, ours.done)
        if ours.done:
            metadata = (
                result.observation.get("metadata", {})
                if isinstance(result.observation, dict)
                else result.observation.metadata
            )
            assert metadata["success"] == ours.info["success"] is True
            return step
    raise AssertionError(f"task {task}: the expert did not finish in {max_steps} steps")


def test_openenv_clients_play_babyai_as_in_process(host, babyai):
    local = _local(host, "babyai", BABYAI)
    try:
        with GenericEnvClient(base_url=babyai.url).sync() as client:
            for task in list(local.tasks("test"))[:3]:
                steps = _play_both(client, local, task)
                state = client.state()
                assert state["step_count"] == steps and state["task_id"] == task
                assert state["done"] is True and state["score"] > 0
        with TypedClient(base_url=babyai.url).sync() as client:
            for task in list(local.tasks("train"))[:3]:
                _play_both(client, local, task)
                assert client.state().step_count >= 1
    finally:
        local.close()


def test_openenv_client_plays_textcraft_as_in_process(host):
    pytest.importorskip("agentgym_env_textcraft")
    options = {"depths": [1, 2]}
    local = _local(host, "textcraft", options)
    app = build_app(host.registry, "textcraft", options, protocol="openenv")
    try:
        with ServerThread(app) as server, GenericEnvClient(base_url=server.url).sync() as client:
            for task in list(local.tasks("train"))[:3]:
                _play_both(client, local, task)
            tasks = httpx.get(f"{server.url}/tasks", params={"split": "test"}).json()["tasks"]
            assert tasks == list(local.tasks("test"))
    finally:
        local.close()


def test_reset_chooses_tasks_by_id_split_index_or_seed(babyai, host):
    local = _local(host, "babyai", BABYAI)
    test_ids = list(local.tasks("test"))
    local.close()
    with GenericEnvClient(base_url=babyai.url).sync() as client:
        by_index = client.reset(split="test", index=2).observation
        assert by_index["task_id"] == test_ids[2]
        seeded = [client.reset(seed=7).observation["task_id"] for _ in range(2)]
        assert seeded[0] == seeded[1]
        assert (
            client.reset(task_id=test_ids[0], episode_id="e-1").observation["task_id"]
            == test_ids[0]
        )
        assert client.state()["episode_id"] == "e-1"


def test_http_routes_and_schema(babyai, host):
    local = _local(host, "babyai", BABYAI)
    task = list(local.tasks("test"))[0]
    with httpx.Client(base_url=babyai.url, timeout=30) as http:
        assert http.get("/health").json() == {"status": "healthy"}
        schema = http.get("/schema").json()
        assert set(schema) == {"action", "observation", "state"}
        assert schema["action"]["required"] == ["text"]
        assert http.get("/metadata").json()["description"] == local.instruction()
        assert http.get("/state").json()["step_count"] == 0
        reset = http.post("/reset", json={"task_id": task}).json()
        assert reset["observation"]["text"] == local.reset(task) and reset["done"] is False
        action = local.expert_action()
        stepped = http.post("/step", json={"action": {"text": action}, "task_id": task}).json()
        assert stepped["observation"]["text"] == local.step(action).observation
        stateless = http.post("/step", json={"action": {"text": "turn left"}})
        assert stateless.status_code == 422 and "/ws" in stateless.json()["detail"]["message"]
        bad = http.post("/reset", json={"split": "test", "index": 10**6})
        assert bad.status_code == 422 and "out of range" in bad.json()["detail"]["message"]
        unknown = http.post("/reset", json={"level": 3})  # ignored, as OpenEnv's server does
        assert unknown.status_code == 200
        assert unknown.json()["observation"]["metadata"]["ignored_reset_keys"] == ["level"]
    local.close()


def _socket(url: str):
    return connect(url.replace("http://", "ws://") + "/ws", proxy=None, open_timeout=10)


def _ask(ws, message: Any) -> dict:
    ws.send(message if isinstance(message, str) else json.dumps(message))
    return json.loads(ws.recv(timeout=30))


def test_bad_input_gets_openenv_errors_and_the_session_goes_on(babyai):
    with _socket(babyai.url) as ws:
        cases = [
            ("{not json", "INVALID_JSON"),
            ({"type": "jump"}, "UNKNOWN_TYPE"),
            ([1, 2], "UNKNOWN_TYPE"),
            ({"type": "step", "data": {"text": "turn left"}}, "EXECUTION_ERROR"),  # before reset
            ({"type": "reset", "data": {"task_id": -1}}, "VALIDATION_ERROR"),
            ({"type": "reset", "data": {"split": "dev"}}, "VALIDATION_ERROR"),
        ]
        for message, code in cases:
            reply = _ask(ws, message)
            assert reply["type"] == "error" and reply["data"]["code"] == code, (message, reply)
        assert (
            "before reset" in _ask(ws, {"type": "step", "data": {"text": "x"}})["data"]["message"]
        )
        ws.send(b"\xff not text either")  # a binary frame: read as text, answered, not a crash
        assert json.loads(ws.recv(timeout=30))["data"]["code"] == "INVALID_JSON"
        assert (
            _ask(ws, {"type": "reset", "data": {"index": 0, "split": "train"}})["type"]
            == "observation"
        )
        missing = _ask(ws, {"type": "step", "data": {}})
        assert (
            missing["data"]["code"] == "VALIDATION_ERROR" and "text" in missing["data"]["message"]
        )
        huge = _ask(ws, {"type": "step", "data": {"text": "x" * (1 << 20)}})
        assert huge["data"]["code"] == "VALIDATION_ERROR"
        assert str(MAX_ACTION_CHARS) in json.dumps(huge["data"])
        played = _ask(ws, {"type": "step", "data": {"text": "turn left"}})
        assert played["type"] == "observation" and played["data"]["done"] is False
        ws.send(json.dumps({"type": "close"}))
        with pytest.raises(ConnectionClosed):  # the server hangs up after close
            ws.recv(timeout=10)
        with pytest.raises(ConnectionClosed):  # a session used after close
            ws.send(json.dumps({"type": "state"}))
            ws.recv(timeout=10)
    assert httpx.get(f"{babyai.url}/health").json() == {"status": "healthy"}


def test_fifty_sessions_at_once_beyond_max_sessions(host):
    app = build_app(host.registry, "babyai", BABYAI, protocol="openenv", max_sessions=20)
    refused = threading.Event()
    with ServerThread(app) as server:
        held: list[tuple[float, float]] = []  # each admitted session: from reset to close

        def session(_: int) -> str:
            with _socket(server.url) as ws:
                reply = _ask(ws, {"type": "reset", "data": {"split": "train", "index": 0}})
                if reply["type"] == "error":
                    refused.set()
                    return reply["data"]["code"]
                admitted = time.monotonic()
                refused.wait(30)  # hold the session till the server has turned one away
                kind = _ask(ws, {"type": "step", "data": {"text": "turn left"}})["type"]
            held.append((admitted, time.monotonic()))
            return kind

        with ThreadPoolExecutor(50) as pool:
            outcomes = list(pool.map(session, range(50)))
        # sessions open at once, as the clients saw them (within the server's own lifetimes):
        # 20 at most, and all 20 taken before the first refusal
        events = sorted([(start, 1) for start, _ in held] + [(end, -1) for _, end in held])
        open_now = most = 0
        for _, change in events:
            open_now += change
            most = max(most, open_now)
        assert most == 20, most
        assert set(outcomes) <= {"observation", "CAPACITY_REACHED"}
        assert "CAPACITY_REACHED" in outcomes
        with GenericEnvClient(base_url=server.url).sync() as client:  # all closed, room again
            assert client.reset(split="train", index=0).done is False
        deadline = time.monotonic() + 30
        while len(server.server.config.app.state.env_server.store) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(server.server.config.app.state.env_server.store) == 0


def test_an_idle_session_expires(host):
    app = build_app(host.registry, "babyai", BABYAI, protocol="openenv", idle_timeout_s=0.5)
    with ServerThread(app) as server, _socket(server.url) as ws:
        assert _ask(ws, {"type": "reset", "data": {}})["type"] == "observation"
        expired = json.loads(ws.recv(timeout=10))
        assert expired["data"]["code"] == "SESSION_ERROR" and "idle" in expired["data"]["message"]
        with pytest.raises(ConnectionClosed):
            ws.recv(timeout=10)


def test_serve_env_command_speaks_openenv(tmp_path):
    from agentgym_core.serve.runner import bind

    sock = bind()
    port = sock.getsockname()[1]
    sock.close()
    command = [sys.executable, "-m", "agentgym_core.cli", "serve-env", "babyai", "--protocol"]
    command += ["openenv", "--port", str(port), "--log-level", "warning"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, server)
        with GenericEnvClient(base_url=url).sync() as client:
            assert client.reset(split="test", index=0).observation["text"]
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 143  # as a shell reports SIGTERM, sessions closed
    assert "OpenEnv protocol" in server.stdout.read()


def _wait_healthy(url: str, process: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, process.stderr.read()
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return
        except httpx.TransportError:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.3)


def test_export_writes_what_openenv_validates_and_its_app_serves(tmp_path):
    """`agentgym export openenv`: OpenEnv's own validator finds only the lock file missing."""
    from openenv.cli._validation import (
        validate_multi_mode_deployment,
        validate_running_environment,
    )

    from agentgym_core.serve.runner import bind

    out = tmp_path / "openenv-babyai"
    command = [sys.executable, "-m", "agentgym_core.cli", "export", "openenv", "babyai"]
    done = subprocess.run(
        [*command, "--out", str(out), "-o", "levels=[GoToObj]"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert {p.name for p in out.iterdir()} >= {"openenv.yaml", "Dockerfile", "README.md"}
    valid, issues = validate_multi_mode_deployment(out)
    # the one check left needs the network: `uv lock` resolves the folder's dependencies
    assert issues == ["Missing uv.lock - run 'uv lock' to generate it"], issues
    assert "openenv>=0.10.0" in (out / "pyproject.toml").read_text()
    bad = subprocess.run(
        [*command, "--out", str(tmp_path / "x"), "-o", "nope=1"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "env.nope: unknown key" in bad.stderr
    sock = bind()
    port = sock.getsockname()[1]
    sock.close()
    serving = [sys.executable, "-m", "server.app", "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(
        serving, cwd=out, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(url, server)
        with GenericEnvClient(base_url=url).sync() as client:
            first = client.reset(split="test", index=0).observation
            assert first["task_group"] == "GoToObj" and first["available_actions"]
        running = validate_running_environment(url)  # `openenv validate --url`
        failed = [c for c in running["criteria"] if not c["passed"]]
        assert running["passed"] and not failed, failed
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
