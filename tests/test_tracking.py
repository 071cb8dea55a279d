"""MLflow tracking against a real SQLite store; UI command; console helpers.

Creating a store runs MLflow's migrations (seconds), so the tests share one
store per module; only the default-store test makes a second.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pluggy
import pytest

from agentgym_core import PROJECT, hookspecs
from agentgym_core.tracking.console import ProgressBar, format_table, postfix_of, update_line
from agentgym_core.tracking.mlflow_tracker import (
    RUN_ID_FILE,
    MlflowTracker,
    flatten,
    metric_key,
    saved_run_id,
)
from agentgym_core.tracking.ui import find_store, ui_command
from agentgym_core.types import Termination, Trajectory, TrajectoryBatch, Turn, round_robin

mlflow = pytest.importorskip("mlflow")


def trajectory(task, group, *, success=True, error=False, turns=2):
    return Trajectory(
        task_id=task,
        group=group,
        token_ids=[1, 2, 3, 4],
        loss_mask=[0, 1, 0, 1],
        logprobs=[0.0, -0.5, 0.0, -0.25],
        turns=[
            Turn(f"go {i}", f"room {i}", 0.5 * i, i == turns - 1, {"pos": i}) for i in range(turns)
        ],
        reward=1.0 if success else 0.0,
        success=success,
        termination=Termination.ENV_ERROR if error else Termination.DONE,
        error="env crashed" if error else None,
        task_group="level-1",
    )


def batch_of(groups=3, per_group=4):
    return TrajectoryBatch(
        [
            trajectory(100 + g, g, success=s % 2 == 0, error=(g, s) == (2, 3))
            for g in range(groups)
            for s in range(per_group)
        ]
    )


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One SQLite store shared by the module's trackers (migrations run once)."""
    folder = tmp_path_factory.mktemp("store")
    return f"sqlite:///{folder / 'mlflow.db'}"


@pytest.fixture
def tracker(store, tmp_path):
    params = {
        "model": {"path": "tiny", "dtype": "float32"},
        "trainer": {"lr": 1e-5},
        "tags": [1, 2],
        "note": "x" * 7000,
    }
    t = MlflowTracker(
        tmp_path / "run",
        uri=store,
        experiment="tests",
        run_name="t",
        params=params,
        log_trajectories=4,
    )
    yield t
    t.close()


def plugin_manager(*plugins):
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    for plugin in plugins:
        pm.register(plugin)
    pm.check_pending()  # every hookimpl matches a hookspec
    return pm


def test_params_are_flattened_and_truncated(tracker):
    params = tracker.client.get_run(tracker.run_id).data.params
    assert params["model.path"] == "tiny"
    assert params["trainer.lr"] == "1e-05"
    assert params["tags"] == "[1, 2]"
    assert len(params["note"]) == 6000
    assert saved_run_id(tracker.run_dir) == tracker.run_id


def test_metrics_land_at_their_steps(tracker):
    pm = plugin_manager(tracker)
    rollout = {"rollout/success_rate": 0.5, "rollout/horizon": 4, "label": "skip me"}
    for step in range(3):
        pm.hook.agentgym_after_rollout(step=step, batch=batch_of(1, 1), metrics=rollout)
        pm.hook.agentgym_after_update(
            step=step, metrics={**rollout, "train/loss": 1.0 / (step + 1), "ok": True}
        )
    pm.hook.agentgym_after_evaluation(step=2, split="test", metrics={"pass@k": 0.75})
    history = tracker.client.get_metric_history(tracker.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    success = tracker.client.get_metric_history(tracker.run_id, "rollout/success_rate")
    assert [m.step for m in success] == [0, 1, 2]  # logged once per step, not twice
    assert tracker.client.get_metric_history(tracker.run_id, "ok")[0].value == 1.0
    evals = tracker.client.get_metric_history(tracker.run_id, "eval/test/pass_at_k")
    assert [(m.step, m.value) for m in evals] == [(2, 0.75)]
    assert "label" not in tracker.client.get_run(tracker.run_id).data.metrics


def test_trajectories_as_jsonl_artifact(tracker, tmp_path):
    plugin_manager(tracker).hook.agentgym_after_rollout(step=12, batch=batch_of(), metrics={})
    local = mlflow.artifacts.download_artifacts(
        run_id=tracker.run_id,
        artifact_path="trajectories/step-000012.jsonl",
        dst_path=str(tmp_path / "dl"),
        tracking_uri=tracker.uri,
    )
    with open(local) as f:
        lines = [json.loads(line) for line in f]
    assert [(d["task_id"], d["group"]) for d in lines] == [(100, 0), (101, 1), (102, 2), (100, 0)]
    assert "token_ids" not in lines[0] and "logprobs" not in lines[0]
    back = Trajectory.from_dict(lines[0])
    assert back.turns[1].observation == "room 1" and back.turns[1].info == {"pos": 1}


def test_an_evaluation_logs_its_own_count_and_traces_keep_to_the_train_count(store, tmp_path):
    """`log_eval_trajectories`: every episode of an evaluation as JSONL, few as traces."""
    tracker = MlflowTracker(
        tmp_path / "run",
        uri=store,
        experiment="eval-count",
        log_trajectories=2,
        log_eval_trajectories=10,
    )
    try:
        episodes = [trajectory(i, 0) for i in range(10)]
        traced = tracker.log_episodes(0, episodes, split="test")
        tracker.log_episodes(1, episodes, split="train")
        local = mlflow.artifacts.download_artifacts(
            run_id=tracker.run_id,
            artifact_path="trajectories",
            dst_path=str(tmp_path / "dl"),
            tracking_uri=tracker.uri,
        )
        logged = Path(local)
        test_lines = (logged / "test" / "step-000000.jsonl").read_text().splitlines()
        train_lines = (logged / "step-000001.jsonl").read_text().splitlines()
        assert len(test_lines) == 10 and len(train_lines) == 2 and len(traced) == 2
    finally:
        tracker.close()


def test_traces_are_linked_and_readable(tracker):
    batch = TrajectoryBatch([trajectory(7, 0, turns=3), trajectory(8, 1, error=True)])
    plugin_manager(tracker).hook.agentgym_after_rollout(step=5, batch=batch, metrics={})
    client = mlflow.MlflowClient(tracking_uri=tracker.uri)
    traces = client.search_traces(locations=[tracker.experiment_id], run_id=tracker.run_id)
    assert len(traces) == 2
    by_task = {t.data.spans[0].inputs["task_id"]: t for t in traces}
    ok, failed = by_task[7], by_task[8]
    root = ok.data.spans[0]
    assert root.name == "episode" and root.parent_id is None
    assert root.inputs == {"task_id": 7, "task_group": "level-1"}
    assert root.outputs == {"reward": 1.0, "success": True, "termination": "done"}
    assert root.get_attribute("agentgym.step") == 5
    turns = sorted(ok.data.spans[1:], key=lambda s: s.start_time_ns)
    assert [s.name for s in turns] == ["turn-0", "turn-1", "turn-2"]
    assert all(s.parent_id == root.span_id for s in turns)
    assert turns[2].inputs == {"action": "go 2"}
    assert turns[2].outputs == {"observation": "room 2", "reward": 1.0, "done": True}
    assert ok.info.tags["agentgym.step"] == "5"
    assert str(failed.info.state) in ("ERROR", "TraceState.ERROR")
    assert failed.data.spans[0].status.status_code == "ERROR"


def test_checkpoint_is_tagged(tracker, tmp_path):
    tracker.agentgym_on_checkpoint(step=4, path=tmp_path / "checkpoint-4")
    tags = tracker.client.get_run(tracker.run_id).data.tags
    assert tags["agentgym.checkpoint_step"] == "4"
    assert tags["agentgym.checkpoint"].endswith("checkpoint-4")


def test_default_store_resume_and_isolation(tracker, tmp_path):
    run_dir = tmp_path / "solo"
    first = MlflowTracker(run_dir, experiment="solo", run_name="a", params={"a": {"b": 1}})
    assert first.uri.startswith("sqlite:///") and (run_dir / "mlflow.db").is_file()
    first.log_metrics(0, {"x": 1.0})
    first.agentgym_after_rollout(step=0, batch=batch_of(1, 2), metrics={})
    tracker.agentgym_after_rollout(step=0, batch=batch_of(1, 1), metrics={})
    assert (run_dir / "mlartifacts").is_dir()
    first.close("KILLED")
    assert (run_dir / RUN_ID_FILE).read_text().strip() == first.run_id

    again = MlflowTracker(run_dir, experiment="solo", run_name="a", params={"a": {"b": 2}})
    assert again.run_id == first.run_id
    run = again.client.get_run(again.run_id)
    assert run.info.status == "RUNNING"
    assert run.data.params["a.b"] == "1"  # params are immutable: the first value stays
    again.log_metrics(1, {"x": 2.0})
    assert [m.step for m in again.client.get_metric_history(again.run_id, "x")] == [0, 1]
    # each tracker's traces went to its own store
    solo = again.client.search_traces(locations=[again.experiment_id])
    shared = tracker.client.search_traces(locations=[tracker.experiment_id], run_id=tracker.run_id)
    assert (len(solo), len(shared)) == (2, 1)
    again.close()
    assert again.client.get_run(again.run_id).info.status == "FINISHED"

    fresh = MlflowTracker(run_dir, experiment="solo", resume=False, traces=False)
    assert fresh.run_id != first.run_id
    fresh.close()


def test_helpers():
    assert flatten({"a": {"b": {"c": 1}}, "d": None, "e": {}}) == {
        "a.b.c": "1",
        "d": "null",
        "e": "{}",
    }
    assert metric_key("group/lvl@2 (hard)/pass@k") == "group/lvl_at_2 _hard_/pass_at_k"
    picked = round_robin(batch_of(3, 2).trajectories, 4)
    assert [t.group for t in picked] == [0, 1, 2, 0]
    assert round_robin([], 8) == []


def test_find_store_and_ui_command(tmp_path):
    runs = tmp_path / "runs"
    (runs / "exp" / "stage-1").mkdir(parents=True)
    (runs / "exp" / "mlflow.db").write_bytes(b"")
    assert find_store(runs / "exp" / "stage-1") == (runs / "exp" / "mlflow.db").resolve()
    assert find_store(runs) == (runs / "exp" / "mlflow.db").resolve()
    command = ui_command(runs / "exp", port=5050)
    assert command[1:4] == ["-m", "mlflow", "ui"]
    backend = command[command.index("--backend-store-uri") + 1]
    assert backend.startswith("sqlite:///") and backend.endswith("exp/mlflow.db")
    root = command[command.index("--default-artifact-root") + 1]
    assert root.startswith("file://") and root.endswith("exp/mlartifacts")
    assert command[-4:] == ["--host", "127.0.0.1", "--port", "5050"]
    assert "--default-artifact-root" not in ui_command("postgresql://db/mlflow")
    with pytest.raises(ValueError):
        ui_command("http://mlflow.example:5000")
    with pytest.raises(FileNotFoundError):
        find_store(tmp_path / "nothing")


def test_progress_bar_off_without_tty_unless_forced():
    quiet = io.StringIO()
    bar = ProgressBar(10, 0, file=quiet)
    bar.update(1, {"rollout/success_rate": 0.5})
    bar.close()
    assert not bar.enabled and quiet.getvalue() == ""
    shown = io.StringIO()
    with ProgressBar(10, 2, force=True, file=shown) as bar:
        bar.update(
            3, {"rollout/success_rate": 0.5, "rollout/reward_mean": 1.25, "rollout/horizon": 8.0}
        )
    assert "3/10" in shown.getvalue() and "success=0.500" in shown.getvalue()
    assert "horizon=8" in shown.getvalue()
    assert postfix_of({"success_rate": 1.0}) == {"success": "1.000"}


def test_update_line_says_what_the_update_did():
    metrics = {
        "rollout/horizon": 6.0,
        "rollout/success_rate": 0.453125,
        "rollout/reward_mean": 0.41,
        "rollout/turns_mean": 4.25,
        "rollout/env_errors": 0.0,
        "train/loss": -0.01234,
        "step_seconds": 9.14,
    }
    assert update_line(12, 150, metrics, "train") == (
        "[train] update 12/150  horizon 6  success 0.453  reward 0.410  turns 4.2"
        "  env errors 0  loss -0.0123  9.1 s"
    )
    replayed = {"rollout/env_errors": 0.0, "rollout/env_errors_replayed": 3.0}
    assert update_line(4, 9, replayed) == "update 4/9  env errors 0 (3 replayed)"
    skipped = {"rollout/success_rate": 0.0, "train/skipped": 1.0, "step_seconds": 1.0}
    assert update_line(1, 2, skipped) == "update 1/2  success 0.000  (nothing to train on)  1.0 s"


def test_format_table():
    table = format_table(
        [{"env": "babyai", "success_rate": 0.5, "n": 10}, {"env": "sci", "n": 3}],
        ["env", "success_rate", "n"],
    )
    assert table.splitlines() == [
        "env     success_rate   n",
        "------  ------------  --",
        "babyai         0.500  10",
        "sci                -   3",
    ]


def test_episode_progress_says_episodes_done_and_success_so_far_every_so_often():
    from types import SimpleNamespace

    from agentgym_core.tracking.console import EpisodeProgress

    now = [0.0]
    lines: list[str] = []
    progress = EpisodeProgress(4, "eval", every_s=30, write=lines.append, clock=lambda: now[0])
    episode = [
        SimpleNamespace(success=True, error=None),
        SimpleNamespace(success=False, error=None),
        SimpleNamespace(success=False, error="EnvCallTimeout: reset"),
        SimpleNamespace(success=True, error=None),
    ]
    now[0] = 30
    for _ in range(7):  # turns of episodes still running: a line even before any ends
        progress.turn()
    for seconds, trajectory in zip([35, 61, 70, 80], episode, strict=True):
        now[0] = seconds
        progress(trajectory)
    assert lines == [
        "[eval] episodes 0/4  turns 1  success -  env errors 0  30 s",
        "[eval] episodes 2/4  turns 7  success 0.500  env errors 0  61 s",
        "[eval] episodes 4/4  turns 7  success 0.667  env errors 1  80 s",
    ]
    quick: list[str] = []
    short = EpisodeProgress(2, "update 1", every_s=30, write=quick.append, clock=lambda: 1.0)
    short(episode[0])
    short(episode[1])
    assert quick == []  # a run shorter than every_s prints nothing
