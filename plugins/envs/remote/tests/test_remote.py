"""The `remote` env: action parsing, both protocol families, replicas, concurrency, config errors.

Servers here are real uvicorn servers on 127.0.0.1: `agentgym serve-env`'s
app, or small FastAPI apps that answer in the shapes of AgentGym's Family B
servers (SearchQA, WebShop, WebArena) and SciWorld's running score.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated

import pytest
from agentgym_env_remote import RemoteConfig, RemoteEnv, RemoteEnvError
from agentgym_env_remote.prompts import (
    TEXTCRAFT_ONE_ACTION,
    ActionRejected,
    after_action,
    listed_actions,
    textcraft_action,
)
from fastapi import Body, FastAPI
from pydantic import ValidationError

from agentgym_core.serve import ServerThread, create_app
from agentgym_core.testing import check_environment
from agentgym_core.types import StepResult

Json = Annotated[dict, Body()]


def remote(url: str | list[str], env: str, **options) -> RemoteEnv:
    urls = url if isinstance(url, list) else [url]
    options.setdefault("train_tasks", [0, 1, 2])
    options.setdefault("test_tasks", [10])
    return RemoteEnv(RemoteConfig(env=env, base_urls=urls, **options))


# -- parsing, as AgentGym's clients ------------------------------------------------------------


def test_action_after_the_marker():
    assert after_action("Thought:\nthe ball is left.\n\nAction:\nturn left</s>") == "turn left"
    assert after_action("  go to red ball 1 ") == "go to red ball 1"
    assert after_action("Action: a\nAction: b") == "a"


def test_textcraft_action_rules():
    assert textcraft_action("Thought: x\nAction: get 2 oak_planks!\n") == "get 2 oakplanks"
    assert textcraft_action("Action: look") == "inventory"
    assert textcraft_action("craft 1 stick using 2 planks") == "craft 1 stick using 2 planks"
    with pytest.raises(ActionRejected) as rejected:
        textcraft_action("Action: inventory\nAction: get 1 log")
    assert rejected.value.observation == TEXTCRAFT_ONE_ACTION


def test_listed_actions_of_babyai_observations():
    text = 'You see a wall.\nAvailable actions: ["turn left", "go to red ball 1"]'
    assert listed_actions(text) == ["turn left", "go to red ball 1"]
    assert listed_actions("Available actions: [broken") is None
    assert listed_actions("no list here") is None


# -- config errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"env": "minecraft"}, "unknown server kind 'minecraft'; known: babyai, sciworld"),
        ({"base_urls": ["localhost:36001"]}, "not an http(s) URL"),
        ({"base_urls": ["http://a:1", "http://a:1/"]}, "lists a server twice"),
        ({"train_tasks": {"start": 5, "stop": 5}}, "stop (5) must be greater than start (5)"),
        ({"timeout_s": 0}, "greater than 0"),
    ],
)
def test_config_errors_say_what_is_wrong(options, message):
    with pytest.raises(ValidationError) as error:
        RemoteConfig(**{"env": "babyai", "base_urls": ["http://127.0.0.1:1"], **options})
    assert message in str(error.value)


def test_unreachable_server_is_an_env_error_naming_it():
    env = remote("http://127.0.0.1:9", "babyai", connect_timeout_s=1)
    try:
        with pytest.raises(RemoteEnvError, match=r"POST http://127.0.0.1:9/create: server unreach"):
            env.reset(0)
    finally:
        env.close()


# -- Family B and score-based servers ---------------------------------------------------------


def family_b_app(kind: str) -> FastAPI:
    """SearchQA, WebShop or WebArena as their servers answer (env_idx, their field names)."""
    app, state = FastAPI(), {"ids": 0, "task": {}, "closed": []}

    @app.post("/create")
    def create(body: Annotated[dict | None, Body()] = None):
        state["ids"] += 1
        return {"env_idx": state["ids"]} if kind == "webarena" else state["ids"]

    @app.post("/reset")
    def reset(body: Json):
        task = {"searchqa": "id", "webshop": "session_id", "webarena": "idx"}[kind]
        state["task"][body["env_idx"]] = body[task]
        if kind == "searchqa":
            return f"Question {body['id']}: who?"
        if kind == "webshop":
            return [None, {}]  # their client reads the page from GET /observation
        return {"observation": f"page {body['idx']}", "sites": [], "object": {}}

    @app.get("/observation")
    def observation(env_idx: int):
        return f"WebShop [SEP] task {state['task'][env_idx]} [SEP] Search"

    @app.post("/step")
    def step(body: Json):
        action = body["action"]
        if kind == "searchqa":
            done = "<answer>" in action
            return {"observation": "info", "reward": float(done), "done": done, "info": {}}
        if kind == "webshop":
            done = action.startswith("click[buy")
            return {"state": f"after {action}", "reward": 0.75 if done else 0.0, "done": done}
        return {
            "observation": "p2",
            "reward": 1.0,
            "terminated": False,
            "truncated": True,
            "info": {},
        }

    @app.post("/close")
    def close(body: Json):
        state["closed"].append(body["env_idx"])
        return {"closed": True} if kind == "webarena" else True

    app.state.fake = state
    return app


def test_searchqa_raw_actions_and_string_reset():
    app = family_b_app("searchqa")
    with ServerThread(app) as server:
        env = remote(server.url, "searchqa")
        assert env.reset(4) == "Question 4: who?"
        assert env.instruction().startswith("You must always reason inside <think>")
        thought = "<think>x</think>\nAction: <search>who</search>"
        result = env.step(thought)
        assert result.info["action"] == thought.strip() and not result.done  # sent whole
        final = env.step("<answer>Ada</answer>")
        assert final.done and final.reward == 1.0 and final.info["success"]
        env.close()
        assert app.state.fake["closed"] == [1]


def test_webshop_state_field_and_observation_after_reset():
    app = family_b_app("webshop")
    with ServerThread(app) as server:
        env = remote(server.url, "webshop", instruction="Shop.")
        assert env.reset(7) == "WebShop [SEP] task 7 [SEP] Search"
        result = env.step("Thought: buy.\n\nAction: \nclick[buy now]")
        assert result.info["action"] == "click[buy now]"
        assert (result.observation, result.reward, result.done) == (
            "after click[buy now]",
            0.75,
            True,
        )
        env.close()


def test_webarena_truncated_ends_the_episode():
    with ServerThread(family_b_app("webarena")) as server:
        env = remote(server.url, "webarena", instruction="Browse.")
        assert env.reset(3) == "page 3"
        result = env.step("Action: click [12]")
        assert result.truncated and not result.done and env.valid_actions() is None
        with pytest.raises(RemoteEnvError, match="after the episode ended"):
            env.step("Action: click [12]")
        env.close()


def test_sciworld_score_becomes_reward_steps_and_success_at_100():
    app, scores = FastAPI(), iter([30, 30, 100])

    @app.post("/create")
    def create():
        return {"id": 0}

    @app.post("/reset")
    def reset(body: Json):
        return {
            "observation": "You are in the kitchen.",
            "task_description": "Boil water.",
            "reward": 0,
            "score": 0,
            "done": False,
        }

    @app.post("/step")
    def step(body: Json):
        score = next(scores)
        return {"observation": "ok", "reward": 0, "score": score, "done": score == 100}

    @app.post("/close")
    def close(body: Json):
        return True

    with ServerThread(app) as server:
        env = remote(server.url, "sciworld")
        assert env.reset(0) == "Boil water.\nYou are in the kitchen."
        rewards = [env.step("Action: look around") for _ in range(3)]
        assert [r.reward for r in rewards] == pytest.approx([0.3, 0.0, 0.7])
        assert [r.info["success"] for r in rewards] == [False, False, True]
        env.close()


# -- our own server: conformance, replicas, bounded concurrency, recycling --------------------


class SlowEnv:
    """Counts how many steps run at once on the server."""

    running = 0
    most = 0
    lock = threading.Lock()

    def tasks(self, split):
        return [0, 1, 2] if split == "train" else [3]

    def instruction(self):
        return "Wait."

    def reset(self, task_id):
        return f"task {task_id}"

    def step(self, action):
        with SlowEnv.lock:
            SlowEnv.running += 1
            SlowEnv.most = max(SlowEnv.most, SlowEnv.running)
        time.sleep(0.1)
        with SlowEnv.lock:
            SlowEnv.running -= 1
        return StepResult(f"did {action}", 1.0, action == "stop")

    def valid_actions(self):
        return ["wait", "stop"]

    def task_group(self, task_id):
        return "slow"

    def close(self):
        pass


def test_check_environment_passes_over_http():
    with ServerThread(create_app(SlowEnv, env_name="slow", can_render=False)) as server:
        check_environment(
            remote(server.url, "agentgym", train_tasks="server", test_tasks="server"),
            num_tasks=2,
            max_steps=3,
        )


def test_replicas_are_balanced_and_concurrency_per_server_is_bounded():
    SlowEnv.most = 0
    apps = [create_app(SlowEnv, env_name="slow", threads=16) for _ in range(2)]
    with ServerThread(apps[0]) as a, ServerThread(apps[1]) as b:
        envs = [remote([a.url, b.url], "agentgym", max_concurrency=2) for _ in range(6)]
        for env in envs:
            env.reset(0)
        assert envs[0].pool.open_ids() == {a.url: 3, b.url: 3}
        begin = time.perf_counter()
        with ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda env: env.step("wait"), envs))
        # 6 steps of 0.1 s, 2 at a time on each of 2 servers: 2 rounds, never more than 2 at once
        assert SlowEnv.most <= 4 and time.perf_counter() - begin >= 0.2
        for env in envs:
            env.close()
        assert all(app.state.env_server.store.closed == 3 for app in apps)


def test_recycle_after_recreates_the_env_id():
    app = create_app(SlowEnv, env_name="slow")
    with ServerThread(app) as server:
        env = remote(server.url, "agentgym", recycle_after=2, instruction="Wait.")
        ids = []
        for task in range(5):
            env.reset(task % 3)
            ids.append(env.env_id)
        env.close()
    assert ids[0] == ids[1] != ids[2] == ids[3] != ids[4]
    assert app.state.env_server.store.created == 3 == app.state.env_server.store.closed


def test_server_tasks_on_an_agentgym_server_say_to_set_them():
    app = FastAPI()
    with ServerThread(app) as server:
        env = remote(server.url, "babyai", train_tasks="server")
        with pytest.raises(RemoteEnvError, match="set env.train_tasks to a list"):
            env.tasks("train")
        env.close()
