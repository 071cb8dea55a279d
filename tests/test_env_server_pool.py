"""A pool of env servers that survives losing one: two real `agentgym serve-env` processes.

One is killed mid-training and another mid-evaluation, each restarted
seconds later. What must hold: no update trains on an env error (the lost
episodes are played again, from reset, on the server that answers); the
evaluation is complete; a killed server gets no new episodes while it is down
and gets them again as soon as a probe finds it up; the metrics count, per
server, episodes, env errors and seconds down.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import yaml

from agentgym_core import hookimpl
from agentgym_core.config.load import load_config
from agentgym_core.run.eval_stage import run_eval_stage
from agentgym_core.run.kinds import run_stage

pytest.importorskip("agentgym_env_babyai")
pytest.importorskip("agentgym_env_remote")
pytest.importorskip("fastapi")

from agentgym_env_remote import RemoteConfig, RemoteEnv  # noqa: E402
from agentgym_env_remote.client import RemoteEnvError, ServerPool, server_name  # noqa: E402
from serve_env_process import EnvServer  # noqa: E402


@pytest.fixture
def servers():
    pair = [EnvServer(), EnvServer()]
    for server in pair:
        server.start()
    yield pair
    for server in pair:
        server.stop()


class KillOne(RemoteEnv):
    """The `remote` env, except that its `kill_at`-th step (over all instances) kills `victim`
    (SIGKILL) and notes the pool's counters then; `restart_after_s` later it starts again
    (None: the plugin restarts it when the update ends)."""

    steps = 0
    kill_at = 0
    victim: EnvServer | None = None
    restart_after_s: float | None = None
    at_kill: dict[str, float] = {}

    def step(self, action):
        KillOne.steps += 1
        if KillOne.steps == KillOne.kill_at:
            KillOne.at_kill = self.pool.counters()
            KillOne.victim.kill(restart_after_s=KillOne.restart_after_s)
        return super().step(action)


class KillOnePlugin:
    @hookimpl
    def agentgym_register_environments(self, register):
        register("kill-one-remote", KillOne, config=RemoteConfig)

    @hookimpl
    def agentgym_after_update(self, step, metrics):
        victim = KillOne.victim
        if KillOne.at_kill and victim.process.poll() is not None and victim.starts == 1:
            victim.start()  # the update it died in is over: back, for the updates after


def _config(tmp_path: Path, model: Path, urls: list[str]) -> Path:
    raw = {
        "run": {"name": "pool", "output_dir": str(tmp_path / "run"), "seed": 3},
        "model": {"path": str(model)},
        "env": {
            "name": "kill-one-remote",
            "env": "babyai",
            "base_urls": urls,
            "train_tasks": {"start": 0, "stop": 40},
            "test_tasks": {"start": 1000, "stop": 1012},
            "timeout_s": 5.0,
            "connect_timeout_s": 1.0,
            "instruction": "Reach the goal.",
        },
        "algorithm": {"name": "grpo"},
        "scheduler": {"name": "fixed", "max_turns": 3},
        "rollout": {"max_context_tokens": 1024, "concurrency": 8, "env_recovery_s": 60},
        "trainer": {"steps": 4, "tasks_per_step": 4, "group_size": 2, "checkpoint_every": 4},
        "eval": {"split": "test", "k": 2, "max_turns": 3},
        "tracking": {"log_trajectories": 0},
    }
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_training_loses_a_server_mid_update_and_trains_on_no_env_error(
    tmp_path, tiny_model_dir, servers, agentgym_plugin, capsys
):
    a, b = servers
    host = agentgym_plugin(KillOnePlugin(), name="kill-one")
    KillOne.steps, KillOne.kill_at, KillOne.victim, KillOne.at_kill = 0, 20, a, {}
    KillOne.restart_after_s = None
    path = _config(tmp_path, tiny_model_dir, [a.url, b.url])
    resolved = load_config(path, ["trainer.steps=10", "trainer.checkpoint_every=10"], host.registry)
    result = run_stage(resolved, host, show_progress=False)
    history = result.history
    assert a.starts == 2 and KillOne.at_kill, "the server was killed mid-training, then restarted"
    assert len(history) == 10
    assert all(step["rollout/env_errors"] == 0 for step in history)  # nothing lost was kept
    assert sum(step["rollout/env_errors_replayed"] for step in history) >= 1
    name_a, name_b = server_name(a.url), server_name(b.url)
    last = history[-1]
    errors_a = last[f"env/server/{name_a}/env_errors"]
    assert errors_a >= 1 and last[f"env/server/{name_b}/env_errors"] == 0
    assert 0 < last[f"env/server/{name_a}/seconds_down"] < 120  # till the update ended, and a start
    # once a probe found it up, the restarted server got new episodes again
    before = KillOne.at_kill[f"server/{name_a}/episodes"]
    assert last[f"env/server/{name_a}/episodes"] > before
    assert last[f"env/server/{name_b}/episodes"] > 0


def test_an_evaluation_that_loses_a_server_is_complete(
    tmp_path, tiny_model_dir, servers, agentgym_plugin, capsys
):
    a, b = servers
    host = agentgym_plugin(KillOnePlugin(), name="kill-one")
    KillOne.steps, KillOne.kill_at, KillOne.victim, KillOne.at_kill = 0, 7, b, {}
    KillOne.restart_after_s = 1.5
    path = _config(tmp_path, tiny_model_dir, [a.url, b.url])
    metrics, runs = run_eval_stage(load_config(path, [], host.registry), host, tiny_model_dir)
    assert KillOne.at_kill and "episodes ended in env_error" in capsys.readouterr().out
    assert metrics["partial"] == 0.0 and metrics["env_errors"] == 0
    assert metrics["episodes"] == 24 and len(runs) == 24
    deadline = time.monotonic() + 120  # the restart (a timer) is not left running past the test
    while b.starts < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_down_server_gets_no_new_episodes_until_a_probe_finds_it_up():
    live, dead = EnvServer(), EnvServer()
    live.start()
    pool = ServerPool([live.url, dead.url], timeout_s=2.0, connect_timeout_s=0.5)
    try:
        with pytest.raises(RemoteEnvError, match="unreachable"):
            pool.request(dead.url, "GET", "/info")
        assert not pool.is_up(dead.url)
        # longer than any timer would have kept it out: only a probe brings it back
        until = time.monotonic() + 6.0
        while time.monotonic() < until:
            assert pool.pick() == live.url
            time.sleep(0.05)
        started = threading.Thread(target=dead.start)
        started.start()
        started.join(60)
        deadline = time.monotonic() + 30.0
        while not pool.is_up(dead.url):
            assert time.monotonic() < deadline, "no probe found the restarted server up"
            time.sleep(0.05)
        pool.opened(live.url)  # the live one now holds an id: the next goes to the other
        assert pool.pick() == dead.url
        counters = pool.counters()
        assert counters[f"server/{server_name(dead.url)}/env_errors"] == 1
        assert counters[f"server/{server_name(dead.url)}/seconds_down"] >= 6.0
        assert counters[f"server/{server_name(live.url)}/seconds_down"] == 0
    finally:
        pool.close()
        live.stop()
        dead.stop()


def _envs(servers: list[EnvServer], count: int) -> list[RemoteEnv]:
    config = RemoteConfig(
        env="babyai",
        base_urls=[server.url for server in servers],
        train_tasks={"start": 0, "stop": 40},
        test_tasks={"start": 1000, "stop": 1012},
        timeout_s=5.0,
        connect_timeout_s=1.0,
    )
    return [RemoteEnv(config) for _ in range(count)]


def test_ids_held_on_a_dead_replica_cost_no_episode(servers):
    """Envs whose ids sit on a replica that died start their next episodes on one that is up:
    the first reset to find it unreachable starts over elsewhere, the others never try it."""
    a, b = servers
    envs = _envs(servers, 4)
    try:
        for task, env in enumerate(envs):
            env.reset(task)
        on_a = [env for env in envs if env.server == a.url]
        assert len(on_a) == 2
        a.kill()
        first, second = on_a
        assert first.reset(10) and first.server == b.url
        errors = first.pool.counters()[f"server/{server_name(a.url)}/env_errors"]
        assert errors >= 1 and not first.pool.is_up(a.url)
        assert second.reset(11) and second.server == b.url
        assert first.pool.counters()[f"server/{server_name(a.url)}/env_errors"] == errors
        for env in envs:
            assert env.step("turn left").observation
    finally:
        for env in envs:
            env.close()


def test_a_restart_a_probe_finds_drops_the_old_ids_before_any_episode_sends_one(servers):
    a, _ = servers
    envs = _envs(servers, 2)
    try:
        for task, env in enumerate(envs):
            env.reset(task)
        held, other = sorted(envs, key=lambda env: env.server != a.url)
        assert held.server == a.url
        a.kill()
        with pytest.raises(RemoteEnvError, match="unreachable"):
            other.pool.request(a.url, "GET", "/info")  # someone finds it down
        a.start()
        deadline = time.monotonic() + 30.0
        while not held.pool.is_up(a.url):
            assert time.monotonic() < deadline, "no probe found the restarted server up"
            time.sleep(0.05)
        assert held.pool.restarts() == {a.url: 1, other.server: 0}
        errors = held.pool.counters()[f"server/{server_name(a.url)}/env_errors"]
        assert held.reset(5)  # a fresh id: the old one was not sent to the new life
        assert held.pool.counters()[f"server/{server_name(a.url)}/env_errors"] == errors
    finally:
        for env in envs:
            env.close()
