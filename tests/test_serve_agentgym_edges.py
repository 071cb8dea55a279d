"""Edges where AgentGym's own clients met `serve-env` answering unlike AgentGym's servers.

`agentenv` is not installable here (PyPI's `agentenv` 0.0.1 is an empty
placeholder), so `TextCraftLike` and `BabyAILike` below do what its
`TextCraftEnvClient` and `BabyAIEnvClient` do with each reply: assert HTTP
200, then index it. TextCraft's client reads `id` and `observation` from the
create reply, `observation` from reset, `observation`, `reward`, `done` from
step; BabyAI's reads `id` from create and `observation`, `reward`, `score`,
`done` from reset and step. Both send the action after keeping only letters,
digits, commas and spaces, and `{"id": N}` to `/close`. Facts about
AgentGym's servers (what they answer) are in `AGENTGYM_PROTOCOL.md`.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from agentgym_core.plugins import PluginHost
from agentgym_core.serve import ServerThread, build_app, create_app
from agentgym_core.types import StepResult

BABYAI = {"levels": ["GoToObj", "OpenDoor"]}
LONG = 25_000
"""An action longer than strict mode's 20,000-character bound."""


class _AgentGymLike:
    """What both AgentGym clients do over HTTP: POST with `id` added, assert 200, return JSON."""

    def __init__(self, base: str, create_body: dict[str, Any] | None) -> None:
        self.http = httpx.Client(base_url=base, timeout=30)
        reply = self.http.post("/create", json=create_body)
        assert reply.status_code == 200, reply.text[:300]
        self.created = reply.json()
        self.env_id = self.created["id"]

    def post(self, path: str, data: dict[str, Any]) -> Any:
        reply = self.http.post(f"/{path}", json={**data, "id": self.env_id})
        assert reply.status_code == 200, reply.text[:300]
        return reply.json()

    @staticmethod
    def sent(action: str) -> str:
        """The action as their clients send it: letters, digits, commas and spaces only."""
        kept = "".join(c for c in action if c.isascii() and (c.isalnum() or c in ", "))
        return " ".join(kept.split())

    def close(self) -> Any:
        return self.post("close", {})


class TextCraftLike(_AgentGymLike):
    def __init__(self, base: str) -> None:
        super().__init__(base, {"minecraft_dir": "agentenv_textcraft/", "commands": None})
        self.observation = self.created["observation"]

    def reset(self, idx: int = 0) -> dict[str, Any]:
        reply = self.post("reset", {"data_idx": idx})
        self.observation = reply["observation"]
        return reply

    def step(self, action: str) -> tuple[str, Any, bool]:
        reply = self.post("step", {"action": self.sent(action)})
        return reply["observation"], reply["reward"], reply["done"]


class BabyAILike(_AgentGymLike):
    def __init__(self, base: str) -> None:
        super().__init__(base, None)

    def reset(self, data_idx: int = 0) -> dict[str, Any]:
        reply = self.post("reset", {"data_idx": data_idx})
        _ = reply["observation"], reply["reward"], reply["score"], reply["done"]
        return reply

    def step(self, action: str) -> tuple[str, Any, bool]:
        reply = self.post("step", {"action": self.sent(action)})
        _ = reply["reward"]
        return reply["observation"], reply["score"], reply["done"]


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return PluginHost()


@pytest.fixture(scope="module")
def textcraft(host):
    pytest.importorskip("agentgym_env_textcraft")
    registration = host.registry.get("environment", "textcraft")
    local = registration.factory(registration.config.model_validate({}))
    with ServerThread(build_app(host.registry, "textcraft", {})) as server:
        yield server, local


@pytest.fixture(scope="module")
def babyai(host):
    pytest.importorskip("agentgym_env_babyai")
    with ServerThread(build_app(host.registry, "babyai", BABYAI)) as server:
        yield server


# -- 1. TextCraft takes any data_idx modulo its goal count ------------------------------------


def test_textcraft_reset_past_the_end_or_negative_wraps_as_agentgym(textcraft):
    server, local = textcraft
    goals = len({*local.tasks("train"), *local.tasks("test")})
    assert goals == 544  # AgentGym's TextCraft has 544 goals too: its modulo is ours
    client = TextCraftLike(server.url)
    try:
        for idx, goal in [(goals, 0), (goals + 7, 7), (-1, goals - 1), (-goals - 2, goals - 2)]:
            assert client.reset(idx)["observation"] == local.reset(goal), idx
    finally:
        client.close()


def test_strict_mode_still_refuses_task_ids_out_of_range(host):
    pytest.importorskip("agentgym_env_textcraft")
    app = build_app(host.registry, "textcraft", {"depths": [1]}, strict=True)
    with ServerThread(app) as server, httpx.Client(base_url=server.url) as http:
        sid = http.post("/create").json()["id"]
        for idx in (544, -1):
            refused = http.post("/reset", json={"id": sid, "data_idx": idx})
            assert refused.status_code == 422 and refused.json()["detail"][0]["loc"][-1] == (
                "data_idx"
            )


# -- 2. a long action is an ordinary step -------------------------------------------------------


def test_long_action_is_an_ordinary_step_on_textcraft(textcraft):
    client = TextCraftLike(textcraft[0].url)
    try:
        observation, reward, done = client.step("Action: " + "x" * LONG)
        assert observation.startswith("Could not execute") and (reward, done) == (0, False)
    finally:
        client.close()


def test_long_action_is_an_ordinary_step_on_babyai(babyai):
    client = BabyAILike(babyai.url)
    try:
        client.reset(0)
        observation, score, done = client.step("x" * LONG)
        assert "The action is not recognized" in observation and (score, done) == (0, False)
    finally:
        client.close()


def test_strict_mode_still_bounds_the_action(babyai, host):
    app = build_app(host.registry, "babyai", BABYAI, strict=True)
    with ServerThread(app) as server, httpx.Client(base_url=server.url) as http:
        sid = http.post("/create").json()["id"]
        http.post("/reset", json={"id": sid, "data_idx": 0})
        refused = http.post("/step", json={"id": sid, "action": "x" * LONG})
        assert refused.status_code == 422
        assert refused.json()["detail"][0]["type"] == "string_too_long"


# -- 3. the smaller differences -------------------------------------------------------------------


class _TinyEnv:
    """Task 0; 'win' ends the episode with reward 1, anything else gives 0."""

    def tasks(self, split: str) -> list[int]:
        return [0]

    def instruction(self) -> str:
        return "Say win."

    def reset(self, task_id: int) -> str:
        if task_id != 0:
            raise ValueError(f"no task {task_id}")
        return "task 0"

    def step(self, action: str) -> StepResult:
        return StepResult(f"you said {action}", float(action == "win"), action == "win")

    def valid_actions(self) -> list[str]:
        return ["win"]

    def task_group(self, task_id: int) -> str:
        return "all"

    def close(self) -> None:
        pass


def test_agentgym_mode_ignores_extra_fields_and_any_integer_id_strict_refuses():
    app = create_app(_TinyEnv, env_name="babyai")
    with ServerThread(app) as server, httpx.Client(base_url=server.url) as http:
        sid = http.post("/create").json()["id"]
        reset = http.post("/reset", json={"id": sid, "data_idx": 0, "seed": 3})
        assert reset.status_code == 200 and reset.json()["observation"] == "task 0"
        step = http.post("/step", json={"id": sid, "action": "go", "thought": "hm"})
        assert step.status_code == 200 and step.json()["observation"] == "you said go"
        negative = http.post("/step", json={"id": -1, "action": "go"})
        assert negative.json() == {"error": "The id -1 is not valid."}  # not 422
        assert http.get("/observation", params={"id": -1}).json() == negative.json()
        assert http.post("/close", json={"id": sid, "extra": True}).json() is True
    app = create_app(_TinyEnv, env_name="babyai", strict=True)
    with ServerThread(app) as server, httpx.Client(base_url=server.url) as http:
        sid = http.post("/create").json()["id"]
        refused = http.post("/reset", json={"id": sid, "data_idx": 0, "seed": 3})
        assert refused.status_code == 422
        assert refused.json()["detail"][0]["type"] == "extra_forbidden"
        assert http.post("/step", json={"id": -1, "action": "go"}).status_code == 422


def test_textcraft_detail_answers_the_last_reply(textcraft):
    server, _ = textcraft
    client = TextCraftLike(server.url)
    try:
        detail = client.http.get("/detail", params={"id": client.env_id})
        assert detail.json() == {
            "observation": client.observation,
            "done": False,
            "reward": 0,
            "deleted": False,
        }
        observation, _, _ = client.step("inventory")
        assert client.http.get(f"/detail?id={client.env_id}").json()["observation"] == observation
    finally:
        client.close()
    gone = client.http.get(f"/detail?id={client.env_id}").json()
    assert gone == {"error": f"The id {client.env_id} is not valid."}


def test_detail_is_textcraft_only_and_not_strict():
    for name, strict in [("babyai", False), ("textcraft", True)]:
        with ServerThread(create_app(_TinyEnv, env_name=name, strict=strict)) as server:
            assert httpx.get(server.url + "/detail", params={"id": 0}).status_code == 404


def test_babyai_close_of_an_id_never_reset_answers_false_and_keeps_it(babyai):
    client = BabyAILike(babyai.url)
    assert client.close() is False  # as AgentGym's BabyAI: no env yet, nothing closed
    assert client.reset(0)["done"] is False  # the id still works
    assert client.close() is True
    assert client.close() is False


def test_strict_close_of_an_id_never_reset_closes_it():
    app = create_app(_TinyEnv, env_name="babyai", strict=True)
    with ServerThread(app) as server, httpx.Client(base_url=server.url) as http:
        sid = http.post("/create").json()["id"]
        assert http.post("/close", json={"id": sid}).json() is True
        assert http.post("/close", json={"id": sid}).status_code == 404


def test_babyai_reset_says_deleted_and_whole_rewards_are_integers(babyai):
    client = BabyAILike(babyai.url)
    try:
        reset = client.reset(0)
        assert reset["deleted"] is False
        assert type(reset["reward"]) is int and type(reset["score"]) is int
        step = client.post("step", {"action": "turn left"})
        assert type(step["reward"]) is int and type(step["score"]) is int
    finally:
        client.close()


def test_textcraft_rewards_are_integers_as_agentgym_sends_them(textcraft):
    with ServerThread(create_app(_TinyEnv, env_name="textcraft")) as server:
        client = TextCraftLike(server.url)
        reset = client.reset(0)
        assert "deleted" not in reset and type(reset["reward"]) is int
        assert type(client.created["reward"]) is int
        _, reward, done = client.step("win")
        assert (reward, done) == (1, True) and type(reward) is int


def test_strict_rewards_stay_floats():
    app = create_app(_TinyEnv, env_name="babyai", strict=True)
    with ServerThread(app) as server, httpx.Client(base_url=server.url) as http:
        sid = http.post("/create").json()["id"]
        reset = http.post("/reset", json={"id": sid, "data_idx": 0}).json()
        assert "deleted" not in reset and type(reset["reward"]) is float
        step = http.post("/step", json={"id": sid, "action": "win"}).json()
        assert step["reward"] == 1.0 and type(step["reward"]) is float


# -- 5. contract violations: a 500 naming them, in every mode ----------------------------------


class _BrokenEnv(_TinyEnv):
    """Task 0 returns None from reset; task 1 lists actions as a str; steps are Gymnasium's."""

    def tasks(self, split: str) -> list[int]:
        return [0, 1, 2]

    def reset(self, task_id: int) -> Any:
        self.task = task_id
        return None if task_id == 0 else "ready"

    def valid_actions(self) -> Any:
        return "win" if self.task == 1 else ["win"]

    def step(self, action: str) -> Any:
        return ("obs", 1.0, True, False, {})


@pytest.mark.parametrize("strict", [False, True], ids=["agentgym", "strict"])
@pytest.mark.parametrize(
    ("call", "method", "value_type", "fix"),
    [
        ({"path": "/reset", "data_idx": 0}, "reset()", "NoneType", "as a str"),
        ({"path": "/reset", "data_idx": 1}, "valid_actions()", "str", "list of str"),
        ({"path": "/step", "action": "win"}, "step()", "tuple", "Gymnasium"),
    ],
    ids=["reset-none", "actions-str", "step-5-tuple"],
)
def test_contract_violation_is_a_500_naming_it(strict, call, method, value_type, fix):
    app = create_app(_BrokenEnv, env_name="broken", strict=strict)
    with ServerThread(app) as server, httpx.Client(base_url=server.url) as http:
        sid = http.post("/create").json()["id"]
        if call["path"] == "/step":
            http.post("/reset", json={"id": sid, "data_idx": 2})
        body = {k: v for k, v in call.items() if k != "path"}
        reply = http.post(call["path"], json={"id": sid, **body})
        assert reply.status_code == 500
        violation = reply.json()["contract_violation"]
        assert violation["env"] == "broken" and violation["method"] == method
        assert violation["value_type"] == value_type and fix in violation["fix"]
        assert "broke the Environment contract" in reply.json()["detail"]
        assert "raised" not in reply.json()["detail"]  # not reported as the env failing
