"""Env outages against a real `agentgym serve-env` process that the tests kill and restart.

Training: an update played while the server was down is not trained on; the
trainer waits for the server, plays the same episodes again and goes on; past
`rollout.env_recovery_s` it stops, and running again resumes. Evaluation:
episodes lost to the outage are played again, so the result is the one an
uninterrupted evaluation gives; an evaluation that stays incomplete says so
and `agentgym eval` exits 3.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentgym_core import hookimpl
from agentgym_core.config.load import load_config
from agentgym_core.plugins import PluginHost
from agentgym_core.rollout.engine import EnvironmentDown
from agentgym_core.run.eval_stage import run_eval_stage
from agentgym_core.run.kinds import run_stage

pytest.importorskip("agentgym_env_babyai")
pytest.importorskip("agentgym_env_remote")
pytest.importorskip("fastapi")

from agentgym_env_remote import RemoteConfig, RemoteEnv  # noqa: E402
from serve_env_process import EnvServer  # noqa: E402


@pytest.fixture
def server():
    server = EnvServer()
    server.start()
    yield server
    server.stop()


class KillBetweenUpdates:
    """Kills the server after update `after` (0-based) is done, restarting it or not."""

    def __init__(self, server: EnvServer, after: int, restart_after_s: float | None) -> None:
        self.server, self.after, self.restart_after_s = server, after, restart_after_s

    @hookimpl
    def agentgym_after_update(self, step, metrics):
        if step == self.after:
            self.server.kill(self.restart_after_s)


def _config(tmp_path: Path, model: Path, url: str, recovery_s: float) -> Path:
    raw = {
        "run": {"name": "outage", "output_dir": str(tmp_path / "run"), "seed": 2},
        "model": {"path": str(model)},
        "env": {
            "name": "remote",
            "env": "babyai",
            "base_urls": [url],
            "train_tasks": {"start": 0, "stop": 40},
            "test_tasks": {"start": 1000, "stop": 1006},
            "timeout_s": 2.0,
            "connect_timeout_s": 1.0,
            "instruction": "Reach the goal.",
        },
        "algorithm": {"name": "grpo"},
        "scheduler": {"name": "fixed", "max_turns": 2},
        "rollout": {"max_context_tokens": 1024, "concurrency": 8, "env_recovery_s": recovery_s},
        "trainer": {"steps": 3, "tasks_per_step": 2, "group_size": 2, "checkpoint_every": 1},
        "eval": {"split": "test", "k": 2, "max_turns": 3},
        "tracking": {"log_trajectories": 0},
    }
    path = tmp_path / "outage.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _train(path: Path, *plugins) -> tuple:
    host = PluginHost()
    for index, plugin in enumerate(plugins):
        host.pm.register(plugin, name=f"test-plugin-{index}")
    return run_stage(load_config(path, [], host.registry), host, show_progress=False)


def test_training_waits_out_a_killed_server_and_replays_the_update(
    tmp_path, tiny_model_dir, server, capsys
):
    path = _config(tmp_path, tiny_model_dir, server.url, recovery_s=60)
    result = _train(path, KillBetweenUpdates(server, after=0, restart_after_s=3.0))
    out = capsys.readouterr().out
    assert server.starts == 2
    assert "update 2: 4 of 4 episodes ended in env_error" in out
    assert (
        "update 2: the environment is down" in out and "replay 1 of 3 once the env answers" in out
    )
    assert len(result.history) == 3
    assert [step["rollout/env_errors"] for step in result.history] == [0.0, 0.0, 0.0]
    assert [step["rollout/env_errors_replayed"] for step in result.history] == [0.0, 4.0, 0.0]
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints == ["step-000001", "step-000002", "step-000003"]


def test_an_outage_longer_than_env_recovery_s_stops_and_a_rerun_resumes(
    tmp_path, tiny_model_dir, server
):
    path = _config(tmp_path, tiny_model_dir, server.url, recovery_s=3)
    with pytest.raises(EnvironmentDown) as raised:
        _train(path, KillBetweenUpdates(server, after=0, restart_after_s=None))
    message = str(raised.value)
    checkpoints = tmp_path / "run" / "checkpoints"
    assert message.startswith("update 2: 4 of 4 episodes ended in env_error")
    assert "env 'remote' did not come back within rollout.env_recovery_s=3 s" in message
    assert "no checkpoint was written for it" in message
    assert message.endswith(f"resumes from the newest weights, {checkpoints / 'step-000001'}.")
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-000001"]
    server.start()
    resumed = _train(path)
    assert resumed.resumed_from == 1 and len(resumed.history) == 3
    assert sorted(p.name for p in checkpoints.iterdir())[-1] == "step-000003"


class KillingRemote(RemoteEnv):
    """The `remote` env, except that its `kill_at`-th step (over all instances) kills the server."""

    steps = 0
    kill_at = 0
    server: EnvServer | None = None

    def step(self, action):
        KillingRemote.steps += 1
        if KillingRemote.steps == KillingRemote.kill_at:
            KillingRemote.server.kill(restart_after_s=2.0)
        return super().step(action)


class KillingPlugin:
    @hookimpl
    def agentgym_register_environments(self, register):
        register("killing-remote", KillingRemote, config=RemoteConfig)


def test_an_evaluation_replays_what_the_outage_cost_and_matches_an_uninterrupted_one(
    tmp_path, tiny_model_dir, server, capsys, agentgym_plugin
):
    path = _config(tmp_path, tiny_model_dir, server.url, recovery_s=60)
    host = agentgym_plugin(KillingPlugin(), name="killing")
    clean, clean_runs = run_eval_stage(load_config(path, [], host.registry), host, tiny_model_dir)
    assert clean["env_errors"] == 0 and clean["partial"] == 0.0
    KillingRemote.steps, KillingRemote.kill_at, KillingRemote.server = 0, 5, server
    resolved = load_config(path, ["env.name=killing-remote"], host.registry)
    metrics, runs = run_eval_stage(resolved, host, tiny_model_dir)
    out = capsys.readouterr().out
    assert (
        server.starts == 2
        and "episodes ended in env_error" in out
        and "once the env answers" in out
    )
    assert metrics["partial"] == 0.0 and metrics["env_errors"] == 0 and metrics["episodes"] == 12
    # same tasks, same per-episode seeds: the replayed episodes are the ones the outage cost
    assert [t.turns[-1].action for t in runs] == [t.turns[-1].action for t in clean_runs]
    for key in ("success_rate", "mean_reward", "avg@k", "pass@k"):
        assert metrics[key] == clean[key]


def test_agentgym_eval_on_a_dead_server_exits_3_and_says_partial(tmp_path, tiny_model_dir, server):
    path = _config(tmp_path, tiny_model_dir, server.url, recovery_s=2)
    server.kill()
    out = tmp_path / "metrics.json"
    command = [sys.executable, "-m", "agentgym_core.cli", "eval", str(path)]
    command += ["eval.env_error_retries=1", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 3, done.stderr[-2000:]
    assert "PARTIAL EVALUATION: 12 of 12 episodes still ended in env_error" in done.stderr
    assert "env_errors" in done.stdout  # the table always shows them
    record = json.loads(out.read_text())
    assert record["partial"] is True and record["env_errors"] == 12
    assert "unreachable" in record["last_env_error"] or "Connect" in record["last_env_error"]
