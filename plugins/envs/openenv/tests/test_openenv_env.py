"""The `openenv` env against real OpenEnv servers on 127.0.0.1.

Two servers: one built only from `openenv`'s own classes (`line_world`,
as a third party publishes an env), and ours (`agentgym serve-env
--protocol openenv`) serving BabyAI. The env must play both as an
in-process env plays, train on them, and turn faults into `env_error`s.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("openenv.core", reason="make installs openenv (docs/openenv.md)")

from agentgym_env_openenv import OpenEnvConfig, OpenEnvEnv, OpenEnvServerError  # noqa: E402

from agentgym_core.plugins import PluginHost  # noqa: E402
from agentgym_core.serve import ServerThread, build_app  # noqa: E402

from .line_world import MAX_MOVES, line_world_app  # noqa: E402

BABYAI = {"levels": ["GoToObj", "OpenDoor", "PickupDist"]}
LINE_TASKS = {
    "reset": {"seed": "{task}"},
    "train_tasks": {"start": 0, "stop": 64},
    "test_tasks": {"start": 1000, "stop": 1032},
    "actions_field": "legal_moves",
    "instruction": "Walk to the target: answer left or right.",
}


@pytest.fixture(scope="module")
def line_world():
    with ServerThread(line_world_app()) as server:
        yield server


@pytest.fixture(scope="module")
def babyai_openenv():
    pytest.importorskip("agentgym_env_babyai")
    host = PluginHost()
    with ServerThread(build_app(host.registry, "babyai", BABYAI, protocol="openenv")) as server:
        yield server, host


def _line_env(url: str, **options) -> OpenEnvEnv:
    return OpenEnvEnv(OpenEnvConfig(base_urls=[url], **{**LINE_TASKS, **options}))


def _walk(env: OpenEnvEnv, task: int) -> tuple[list, int]:
    """Walk straight at the target (read from the observation); the results and the target."""
    observation = env.reset(task)
    target = int(observation.rstrip(".").split()[-1])
    move = "right" if target > 0 else "left"
    results = []
    while not results or not results[-1].done:
        results.append(env.step(move))
    return results, target


def test_an_env_built_with_openenv_core_plays_multi_turn(line_world):
    """Action field from /schema, text and actions from the observation, reward and done."""
    env = _line_env(line_world.url)
    try:
        assert env.tasks("train") == list(range(64)) and env.tasks("test")[0] == 1000
        for task in range(6):
            results, target = _walk(env, task)
            assert len(results) == abs(target)  # one session, several turns
            assert [r.reward for r in results] == [0.0] * (abs(target) - 1) + [1.0]
            assert results[-1].info["success"] is True and env.valid_actions() is None
        env.reset(0)
        assert env.valid_actions() == ["left", "right"]
        wrong = [env.step("jump") for _ in range(MAX_MOVES)]
        assert wrong[0].observation.startswith("Unknown move 'jump'")
        assert wrong[-1].done and wrong[-1].info["success"] is False and wrong[-1].reward == 0.0
        assert env.task_group(0) == "openenv"
        assert env.instruction() == LINE_TASKS["instruction"]
    finally:
        env.close()


def test_the_same_seed_is_the_same_task_across_sessions(line_world):
    first, second = _line_env(line_world.url), _line_env(line_world.url)
    try:
        assert [first.reset(t) for t in range(10)] == [second.reset(t) for t in range(10)]
        assert len({first.reset(t) for t in range(10)}) > 1
    finally:
        first.close(), second.close()


def test_our_openenv_server_plays_as_in_process(babyai_openenv):
    """BabyAI through serve-env --protocol openenv and this env == BabyAI in-process."""
    server, host = babyai_openenv
    registration = host.registry.get("environment", "babyai")
    local = registration.factory(registration.config.model_validate(BABYAI))
    remote = OpenEnvEnv(OpenEnvConfig(base_urls=[server.url]))
    try:
        assert remote.tasks("test") == list(local.tasks("test"))
        assert remote.instruction() == local.instruction()
        for task in list(local.tasks("test"))[:4]:
            assert remote.reset(task) == local.reset(task)
            assert remote.task_group(task) == local.task_group(task)
            for _ in range(40):
                assert remote.valid_actions() == local.valid_actions()
                action = local.expert_action()
                theirs, ours = remote.step(action), local.step(action)
                assert (theirs.observation, theirs.reward, theirs.done) == (
                    ours.observation,
                    ours.reward,
                    ours.done,
                )
                assert theirs.info["success"] == ours.info["success"]
                if ours.done:
                    break
            assert ours.done and ours.info["success"]
    finally:
        remote.close(), local.close()


def test_a_lost_server_is_an_env_error_and_the_next_reset_reconnects():
    """The session dies with its server; after a restart on the same port, reset works again."""
    server = ServerThread(line_world_app()).start()
    port = server.port
    env = _line_env(server.url, timeout_s=5, connect_timeout_s=2)
    try:
        env.reset(1)
        server.stop()
        with pytest.raises(OpenEnvServerError, match="lost|closed|cannot open"):
            env.step("left")
        with pytest.raises(OpenEnvServerError, match="cannot open a session"):
            env.reset(1)
        server = ServerThread(line_world_app(), port=port).start()
        results, target = _walk(env, 1)
        assert results[-1].reward == 1.0 and len(results) == abs(target)
    finally:
        env.close()
        server.stop()


def test_episodes_spread_over_replicas():
    with ServerThread(line_world_app()) as a, ServerThread(line_world_app()) as b:
        envs = [OpenEnvEnv(OpenEnvConfig(base_urls=[a.url, b.url], **LINE_TASKS)) for _ in range(4)]
        try:
            for env in envs:
                env.reset(0)
            used = [env._session.base_url for env in envs]
            assert used.count(a.url) == 2 and used.count(b.url) == 2
        finally:
            for env in envs:
                env.close()


def test_adapters_map_other_shapes(line_world, monkeypatch, tmp_path):
    """An author's `module:function` adapters, named in the env block."""
    (tmp_path / "my_adapters.py").write_text(
        "def to_action(text):\n"
        "    return {'move': 'right' if 'east' in text else 'left'}\n"
        "def read(observation):\n"
        "    return observation['prompt'].upper(), ['east', 'west']\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    env = _line_env(
        line_world.url,
        action_adapter="my_adapters:to_action",
        observation_adapter="my_adapters:read",
    )
    try:
        assert env.reset(0).startswith("YOU ARE AT 0")
        assert env.valid_actions() == ["east", "west"]
        assert env.step("go east").observation.startswith("YOU ARE AT 1")
    finally:
        env.close()


def test_config_errors_name_the_key():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="not an http"):
        OpenEnvConfig(base_urls=["127.0.0.1:8000"])
    with pytest.raises(ValidationError, match="module:function"):
        OpenEnvConfig(base_urls=["http://x"], action_adapter="no_colon")
    with pytest.raises(ValueError, match="env.action_adapter: cannot import 'nowhere'"):
        OpenEnvEnv(OpenEnvConfig(base_urls=["http://x"], action_adapter="nowhere:f"))


def test_an_action_schema_without_one_text_field_asks_for_an_adapter():
    from agentgym_env_openenv.adapters import action_field_from_schema

    schema = {"properties": {"x": {"type": "integer"}, "y": {"type": "integer"}}}
    with pytest.raises(ValueError, match=r"fields \['x', 'y'\].*env.action_adapter"):
        action_field_from_schema(schema, "http://h")
    assert action_field_from_schema({"properties": {"move": {"type": "string"}}}, "u") == "move"


def test_train_and_evaluate_on_an_openenv_core_server(agentgym_train):
    """A short GRPO run and a held-out evaluation, every episode played over /ws; then an
    evaluation whose server is gone says it is partial."""
    from agentgym_core.evaluation.metrics import measured
    from agentgym_core.run.eval_stage import run_eval_stage

    server = ServerThread(line_world_app()).start()
    run = agentgym_train(
        {
            "env": {"name": "openenv", "base_urls": [server.url], **LINE_TASKS},
            "algorithm": {"name": "grpo"},
            "scheduler": {"name": "fixed", "max_turns": MAX_MOVES},
            "rollout": {
                "max_context_tokens": 512,
                "max_new_tokens": 4,
                "concurrency": 8,
                "env_recovery_s": 1,
            },
            "trainer": {"steps": 3, "tasks_per_step": 4, "group_size": 4},
            "eval": {"split": "test", "num_tasks": 16, "max_turns": MAX_MOVES},
        }
    )
    try:
        _check_trained_and_evaluated(run, run_eval_stage)
    finally:
        server.stop()
    metrics, trajectories = run_eval_stage(run.config, PluginHost(), run.checkpoint)
    assert measured(metrics) == (0, 16) and metrics["env_errors"] == 16
    assert all(server.url in t.error for t in trajectories)  # each names the server it lost


def test_train_on_our_openenv_server(babyai_openenv, agentgym_train):
    server, _ = babyai_openenv
    run = agentgym_train(
        {
            "env": {"name": "openenv", "base_urls": [server.url]},
            "algorithm": {"name": "grpo"},
            "scheduler": {"name": "fixed", "max_turns": 3},
            "rollout": {"max_context_tokens": 768, "concurrency": 8},
            "trainer": {"steps": 2, "tasks_per_step": 2, "group_size": 4},
        }
    )
    assert len(run.history) == 2
    groups = {t.task_group for b in run.batches.values() for t in b.trajectories}
    assert groups <= set(BABYAI["levels"]) and groups  # BabyAI's levels, named over /ws
    assert all(step["rollout/env_errors"] == 0 for step in run.history)


def _check_trained_and_evaluated(run, run_eval_stage) -> None:
    assert len(run.history) == 3
    assert all(step["rollout/env_errors"] == 0 for step in run.history)
    for batch in run.batches.values():
        for trajectory in batch.trajectories:
            assert trajectory.turns and trajectory.termination.value in ("done", "max_turns")
            assert trajectory.reward in (0.0, 1.0)
            assert trajectory.success == (trajectory.reward == 1.0)
    started = time.monotonic()
    metrics, trajectories = run_eval_stage(run.config, PluginHost(), run.checkpoint)
    assert time.monotonic() - started < 120
    assert metrics["episodes"] == 16 and metrics["env_errors"] == 0
    assert {t.task_id for t in trajectories} == set(range(1000, 1016))
    assert 0.0 <= metrics["success_rate"] <= 1.0
