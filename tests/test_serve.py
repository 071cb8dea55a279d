"""`agentgym serve-env` on real uvicorn servers, and the `remote` env talking to it.

Parity: the same actions give the same observations, rewards and ends over
HTTP as in-process (BabyAI and TextCraft). Load: 64 concurrent sessions.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from agentgym_core.plugins import PluginHost
from agentgym_core.serve import ServerThread, build_app, create_app
from agentgym_core.types import StepResult

pytest.importorskip("agentgym_env_babyai")
pytest.importorskip("agentgym_env_remote")

from agentgym_env_remote import RemoteConfig, RemoteEnv  # noqa: E402

BABYAI = {"levels": ["GoToObj", "OpenDoor", "PickupDist"]}


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return PluginHost()


@pytest.fixture(scope="module")
def babyai_server(host):
    with ServerThread(build_app(host.registry, "babyai", BABYAI)) as server:
        yield server


def _local(host, name, options):
    registration = host.registry.get("environment", name)
    return registration.factory(registration.config.model_validate(options))


def _remote(url, env="babyai", **options) -> RemoteEnv:
    options.setdefault("train_tasks", {"start": 0, "stop": 50})
    options.setdefault("test_tasks", {"start": 1000, "stop": 1010})
    return RemoteEnv(RemoteConfig(env=env, base_urls=[url], **options))


def _same(remote: StepResult, local: StepResult) -> None:
    assert remote.observation == local.observation
    assert remote.reward == pytest.approx(local.reward, abs=0)
    assert (remote.done, remote.truncated) == (local.done, local.truncated)
    assert remote.info["success"] == local.info["success"]


def _play_both(remote, local, task, wrap=lambda a: a, max_steps=40) -> int:
    """Expert actions on both; every reply must match. Returns the number of steps."""
    assert remote.reset(task) == local.reset(task)
    for step in range(1, max_steps + 1):
        assert remote.valid_actions() == local.valid_actions()
        action = local.expert_action()
        remote_result, local_result = remote.step(wrap(action)), local.step(action)
        _same(remote_result, local_result)
        assert remote_result.info["action"] == action
        if local_result.done:
            assert remote.valid_actions() is None
            return step
    raise AssertionError(f"task {task}: expert did not finish in {max_steps} steps")


# -- parity: remote == in-process --------------------------------------------------------------


def test_babyai_over_http_matches_in_process(host, babyai_server):
    remote, local = _remote(babyai_server.url), _local(host, "babyai", BABYAI)
    try:
        for task in range(6):  # two of each level
            steps = _play_both(remote, local, task, wrap=lambda a: f"Thought:\nok.\n\nAction:\n{a}")
            assert steps >= 1 and remote.task_group(task) == local.task_group(task)
        # invalid actions are ordinary replies, as on AgentGym's server
        remote.reset(0), local.reset(0)
        _same(remote.step("Action: fly away"), local.step("fly away"))
    finally:
        remote.close(), local.close()
    assert httpx.get(f"{babyai_server.url}/info").json()["sessions"] == 0


def test_textcraft_over_http_matches_in_process(host):
    pytest.importorskip("agentgym_env_textcraft")
    options = {"depths": [1, 2]}
    local = _local(host, "textcraft", options)
    with ServerThread(build_app(host.registry, "textcraft", options)) as server:
        remote = _remote(server.url, "textcraft", train_tasks="server", test_tasks="server")
        try:
            assert remote.tasks("train") == local.tasks("train")
            assert remote.tasks("test") == local.tasks("test")
            for task in local.tasks("train")[:4]:
                _play_both(remote, local, task, wrap=lambda a: f"Thought:\nneed it.\n\nAction: {a}")
            # AgentGym's TextCraft client rejects two actions without calling the server
            remote.reset(local.tasks("train")[0])
            rejected = remote.step("Action: inventory\nAction: inventory")
            assert rejected.observation.startswith("Error: Only one 'Action'")
        finally:
            remote.close(), local.close()


def test_generic_agentgym_dialect_takes_tasks_and_instruction_from_the_server(host, babyai_server):
    remote = _remote(babyai_server.url, "agentgym", train_tasks="server", test_tasks="server")
    local = _local(host, "babyai", BABYAI)
    try:
        assert remote.tasks("test") == local.tasks("test")
        assert remote.instruction() == local.instruction()
        _play_both(remote, local, local.tasks("test")[0])
    finally:
        remote.close(), local.close()


# -- the server's own HTTP behaviour -------------------------------------------------------------


def test_strict_errors_are_real_status_codes_naming_the_field(host):
    strict = ServerThread(build_app(host.registry, "babyai", BABYAI, strict=True))
    with strict as server, httpx.Client(base_url=server.url) as http:
        sid = http.post("/create").json()["id"]
        cases = [
            (http.post("/step", json={"id": sid}), 422, ["body", "action"]),
            (http.post("/step", json={"id": "seven", "action": "x"}), 422, ["body", "id"]),
            (http.post("/reset", json={"id": sid, "data_idx": -1}), 422, ["body", "data_idx"]),
            (http.post("/step", json={"id": sid, "action": "turn left"}), 409, ["body", "id"]),
            (http.post("/step", json={"id": sid + 10**6, "action": "x"}), 404, ["body", "id"]),
            (http.get("/observation", params={"id": sid + 10**6}), 404, ["query", "id"]),
            (http.post("/close", json={"id": sid + 10**6}), 404, ["body", "id"]),
            (http.get("/tasks", params={"split": "dev"}), 422, ["query", "split"]),
        ]
        for response, status, loc in cases:
            assert response.status_code == status, response.text
            assert [d["loc"] for d in response.json()["detail"]] == [loc]
        bad_json = http.post(
            "/reset", content=b"{id: 1", headers={"content-type": "application/json"}
        )
        assert bad_json.status_code == 422
        # after done, step is refused until the next reset (as AgentGym's BabyAI server)
        http.post("/reset", json={"id": sid, "data_idx": 0})
        expert = _local(host, "babyai", BABYAI)
        expert.reset(0)
        for _ in range(40):
            action = expert.expert_action()
            expert.step(action)
            if http.post("/step", json={"id": sid, "action": action}).json()["done"]:
                break
        assert http.post("/step", json={"id": sid, "action": "turn left"}).status_code == 409
        # the babyai factory is a function (it picks the level set): the envs it makes render
        assert http.get("/info").json()["can_render"] is True
        drawn = http.get("/render", params={"id": sid}).json()
        assert drawn["format"] == "png"
        assert base64.b64decode(drawn["data"]).startswith(b"\x89PNG")
        assert http.post("/close", json={"id": sid}).json() is True
        schema = http.get("/openapi.json").json()
        assert {"/create", "/reset", "/step", "/observation", "/close"} <= set(schema["paths"])


class _BlindEnv:
    """An env without render(), made by a factory function (so /render cannot be ruled out)."""

    def tasks(self, split):
        return [0]

    def instruction(self):
        return "Say anything."

    def reset(self, task_id):
        return "start"

    def step(self, action):
        return StepResult("ok", 1.0, True)

    def valid_actions(self):
        return ["x"]

    def task_group(self, task_id):
        return "all"

    def close(self):
        pass


def test_a_factory_function_whose_envs_cannot_render_says_so():
    app = create_app(lambda: _BlindEnv(), env_name="blind", strict=True)
    with ServerThread(app) as server, httpx.Client(base_url=server.url) as http:
        assert http.get("/info").json()["can_render"] is False
        sid = http.post("/create").json()["id"]
        http.post("/reset", json={"id": sid, "data_idx": 0})
        refused = http.get("/render", params={"id": sid})
        assert refused.status_code == 404
        assert refused.json() == {"detail": "environment blind cannot render: it has no render()"}


class _DrawnEnv:
    """A small env that renders, and whose step 'slow' blocks for a while."""

    def __init__(self, delay=0.0):
        self.delay, self.state = delay, ""

    def tasks(self, split):
        return [0, 1] if split == "train" else [2]

    def instruction(self):
        return "Say slow or fast."

    def reset(self, task_id):
        self.state = f"task {task_id}"
        return self.state

    def step(self, action):
        if action == "slow":
            time.sleep(self.delay)
        self.state = action
        return StepResult(f"you said {action}", 1.0, action == "fast", info={"n": float("nan")})

    def valid_actions(self):
        return ["slow", "fast"]

    def task_group(self, task_id):
        return "all"

    def render(self):
        return f"[{self.state}]"

    def close(self):
        pass


def test_render_slow_steps_off_the_event_loop_and_idle_reaping():
    app = create_app(
        # times with room for a busy machine: a 6 s step, sessions reaped after 3 s idle
        lambda: _DrawnEnv(delay=6.0),
        env_name="drawn",
        idle_timeout_s=3.0,
        can_render=True,
    )
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=10) as http:
        slow, fast = (http.post("/create").json()["id"] for _ in range(2))
        for sid in (slow, fast):
            http.post("/reset", json={"id": sid, "data_idx": 0})
        assert http.get("/render", params={"id": fast}).json() == {
            "format": "text",
            "data": "[task 0]",
        }
        started = threading.Event()

        def slow_step():
            started.set()
            return http.post("/step", json={"id": slow, "action": "slow"})

        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(slow_step)
            started.wait()
            time.sleep(0.2)
            begin = time.perf_counter()
            reply = http.post("/step", json={"id": fast, "action": "fast"})
            fast_seconds = time.perf_counter() - begin
            assert reply.json()["done"] and reply.json()["info"] == {"n": None}
            assert fast_seconds < 4.0, "a slow step of another session held this one up"
            assert pending.result().json()["observation"] == "you said slow"
        deadline = time.monotonic() + 30
        while http.get("/info").json()["sessions"] and time.monotonic() < deadline:
            time.sleep(0.1)
        info = http.get("/info").json()
        assert info["sessions"] == 0 and info["closed"] == 2
        gone = http.post("/reset", json={"id": slow, "data_idx": 0})  # AgentGym's answer
        assert gone.status_code == 200 and gone.json() == {"error": f"The id {slow} is not valid."}


def test_max_sessions_answers_503():
    app = create_app(lambda: _DrawnEnv(), env_name="drawn", max_sessions=2)
    with ServerThread(app) as server, httpx.Client(base_url=server.url) as http:
        ids = [http.post("/create").json()["id"] for _ in range(2)]
        refused = http.post("/create")
        assert refused.status_code == 503 and "max_sessions" in refused.json()["detail"]
        http.post("/close", json={"id": ids[0]})
        assert http.post("/create").status_code == 200


def test_serve_env_command_binds_loopback_and_serves(tmp_path):
    with socket.socket() as probe:  # a free port, released for the server to take
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "agentgym_core.cli", "serve-env", "babyai", "--port"]
    flags = ["--env-option", "levels=[GoToObj]", "--log-level", "warning", "--strict"]
    process = subprocess.Popen(
        [*command, str(port), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180  # importing torch on a loaded machine: 60 s+
        while True:
            try:
                info = httpx.get(f"http://127.0.0.1:{port}/info", timeout=1).json()
                break
            except httpx.TransportError:
                assert process.poll() is None, process.stdout.read()
                assert time.monotonic() < deadline, "serve-env did not start"
                time.sleep(0.2)
        assert info["env"] == "babyai" and info["strict"] is True
        unknown = httpx.post(f"http://127.0.0.1:{port}/close", json={"id": 7}, timeout=5)
        assert unknown.status_code == 404  # `--strict` reached the app
        listening = subprocess.run(["ss", "-ltn"], capture_output=True, text=True).stdout
        if listening:  # `ss` is there on Linux CI; the socket must be loopback only
            assert f"127.0.0.1:{port}" in listening and f"0.0.0.0:{port}" not in listening
    finally:
        process.terminate()
        process.wait(20)


def test_unknown_env_name_lists_installed_ones(capsys):
    from agentgym_core.cli import main

    assert main(["serve-env", "nosuchenv"]) == 2
    error = capsys.readouterr().err
    assert "unknown environment 'nosuchenv'" in error and "babyai" in error


# -- load -----------------------------------------------------------------------------------------


def test_64_concurrent_sessions_no_errors_all_closed(babyai_server):
    """64 remote envs, each a whole expert episode at once; the server ends with no session."""
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    before = httpx.get(f"{babyai_server.url}/info").json()

    def episode(task: int) -> float:
        remote = _remote(babyai_server.url, max_concurrency=64, timeout_s=60)
        expert = BabyAIEnv(BabyAIConfig(**BABYAI))
        try:
            remote.reset(task), expert.reset(task)
            for _ in range(40):
                action = expert.expert_action()
                result, mirror = remote.step(action), expert.step(action)
                assert result.observation == mirror.observation
                if result.done:
                    return result.reward
            raise AssertionError(f"task {task} did not finish")
        finally:
            remote.close(), expert.close()

    async def run_all():
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(64) as pool:
            return await asyncio.gather(
                *(loop.run_in_executor(pool, episode, t) for t in range(64))
            )

    rewards = asyncio.run(run_all())
    assert len(rewards) == 64 and all(r > 0 for r in rewards)
    after = httpx.get(f"{babyai_server.url}/info").json()
    assert after["sessions"] == 0
    assert after["created"] - before["created"] == 64 == after["closed"] - before["closed"]


class _DropOnce(httpx.BaseTransport):
    """Fails the first request for `path` as a connection dropped before any reply."""

    def __init__(self, inner: httpx.BaseTransport, path: str) -> None:
        self.inner, self.path, self.dropped = inner, path, False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == self.path and not self.dropped:
            self.dropped = True
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def test_a_dropped_connection_ends_its_own_episode_and_no_other(babyai_server):
    """The server names its life in every reply, so a connection lost on one request is not
    taken for a restart: the other sessions on that server play on."""
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv
    from agentgym_env_remote import RemoteEnvError

    dropped, other = _remote(babyai_server.url), _remote(babyai_server.url)
    expert = BabyAIEnv(BabyAIConfig(**BABYAI))
    client = dropped.pool._servers[babyai_server.url].client
    try:
        assert other.pool is dropped.pool  # one pool, as every env of a run shares it
        dropped.reset(0), other.reset(1), expert.reset(1)
        client._transport = _DropOnce(client._transport, "/step")
        with pytest.raises(RemoteEnvError, match="unreachable.*RemoteProtocolError"):
            dropped.step("turn left")
        for _ in range(40):
            action = expert.expert_action()
            result, mirror = other.step(action), expert.step(action)
            assert result.observation == mirror.observation
            if result.done:
                break
        assert result.done and result.reward > 0
        assert dropped.reset(2)  # a new id, on the same server
        assert dropped.pool.restarts() == {babyai_server.url: 0}
    finally:
        client._transport = getattr(client._transport, "inner", client._transport)
        dropped.close(), other.close(), expert.close()


def test_step_latency_slows_every_reset_and_step_and_changes_nothing_else(host):
    import time

    app = build_app(host.registry, "babyai", BABYAI, step_latency_s=0.3)
    local = _local(host, "babyai", BABYAI)
    with ServerThread(app) as server:
        remote = _remote(server.url)
        try:
            begin = time.perf_counter()
            assert remote.reset(3) == local.reset(3)
            action = local.valid_actions()[0]
            _same(remote.step(action), local.step(action))
            assert time.perf_counter() - begin >= 0.6
        finally:
            remote.close()
            local.close()
