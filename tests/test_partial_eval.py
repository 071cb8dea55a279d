"""A partial evaluation cannot be misread: the table, `--json`, MLflow and the viewer say it.

The real tests start `agentgym serve-env babyai`, evaluate through the `remote`
env, and a step of the evaluation kills the server for good (SIGKILL, from
`tests/killing_remote.py`, loaded by the `agentgym` subprocess through an
entry point). Every place the result appears must say PARTIAL with counts
that agree: measured + env_error = played, and the group rows add up to all.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agentgym_core.tracking.mlflow_tracker import MlflowTracker

HERE = Path(__file__).resolve().parent
TASKS = 12
K = 2
PLAYED = TASKS * K


def test_mlflow_tags_say_partial_beside_the_episode_count(tmp_path):
    tracker = MlflowTracker(tmp_path, run_name="t/eval", traces=False, log_trajectories=0)
    metrics = {"success_rate": 1.0, "episodes": 7.0, "env_errors": 73.0, "partial": 1.0}
    tracker.agentgym_after_evaluation(step=0, split="test", metrics=metrics)
    complete = {"success_rate": 0.25, "episodes": 8.0, "env_errors": 0.0, "partial": 0.0}
    tracker.agentgym_after_evaluation(step=0, split="valid", metrics=complete)
    tracker.agentgym_after_evaluation(step=0, split="other", metrics={"pass@k": 0.5})  # no count
    run = tracker.client.get_run(tracker.run_id)
    tracker.close()
    tags, logged = run.data.tags, run.data.metrics
    assert tags["agentgym.eval.test.partial"] == "true"
    assert (
        tags["agentgym.eval.test"] == "success 1.000 over 7 of 80 episodes: PARTIAL, 73 env_error"
    )
    assert tags["agentgym.eval.valid.partial"] == "false"
    assert tags["agentgym.eval.valid"] == "success 0.250 over 8 of 8 episodes"
    assert "agentgym.eval.other" not in tags
    assert logged["eval/test/partial"] == 1.0 and logged["eval/test/episodes"] == 7.0


# -- a real server, killed for good mid-evaluation --------------------------------------


@pytest.fixture
def server():
    pytest.importorskip("agentgym_env_babyai")
    pytest.importorskip("agentgym_env_remote")
    httpx = pytest.importorskip("httpx")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "agentgym_core.cli", "serve-env", "babyai"]
    command += ["--port", str(port), "--env-option", "levels=[GoToObj,GoToLocal]"]
    process = subprocess.Popen(
        [*command, "--log-level", "warning"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"{url}/info", timeout=1)
            break
        except httpx.TransportError:
            assert process.poll() is None, "serve-env exited"
            assert time.monotonic() < deadline, "serve-env did not start"
            time.sleep(0.2)
    yield url, process.pid
    if process.poll() is None:
        process.kill()
    process.wait(10)


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict[str, str]:
    """Environment variables under which `agentgym` finds `killing-remote` as an entry point."""
    site = tmp_path_factory.mktemp("killing-site")
    info = site / "agentgym_test_killing-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: agentgym-test-killing\nVersion: 0\n"
    )
    (info / "entry_points.txt").write_text("[agentgym]\nkilling = killing_remote\n")
    path = os.pathsep.join(p for p in [str(HERE), str(site), os.environ.get("PYTHONPATH")] if p)
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")


def _config(tmp_path: Path, model: Path, server: tuple[str, int], **extra) -> Path:
    url, pid = server
    raw = {
        "run": {"name": "partial", "output_dir": str(tmp_path / "run"), "seed": 2},
        "model": {"path": str(model)},
        "env": {
            "name": "killing-remote",
            "env": "babyai",
            "base_urls": [url],
            "train_tasks": {"start": 0, "stop": 40},
            "test_tasks": {"start": 1000, "stop": 1000 + TASKS},
            "timeout_s": 2.0,
            "connect_timeout_s": 1.0,
            "instruction": "Reach the goal.",
            "kill_pid": pid,
            "kill_at": 14,  # two episodes at a time: a few end before it, the rest cannot
        },
        "algorithm": {"name": "grpo"},
        "scheduler": {"name": "fixed", "max_turns": 3},
        "rollout": {"max_context_tokens": 1024, "concurrency": 2, "env_recovery_s": 2},
        "eval": {"split": "test", "k": K, "max_turns": 3, "env_error_retries": 1},
        "tracking": {"log_trajectories": 100},
        **extra,
    }
    path = tmp_path / "partial.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _agentgym(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "agentgym_core.cli", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)


def _table(stdout: str) -> tuple[str, dict[str, list[str]]]:
    """The PARTIAL line above the table, and each row's cells by group name."""
    lines = stdout.splitlines()
    top = next(i for i, line in enumerate(lines) if line.startswith("PARTIAL EVALUATION"))
    header = re.split(r"\s{2,}", lines[top + 1].strip())
    rows = {}
    for line in lines[top + 3 :]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != len(header):
            break
        rows[cells[0]] = cells
    assert "all" in rows, stdout
    return lines[top], {name: dict(zip(header, cells, strict=True)) for name, cells in rows.items()}


def _check_table(stdout: str) -> tuple[int, int]:
    """The table says partial with counts that add up; returns (measured, env_errors)."""
    heading, rows = _table(stdout)
    total = rows.pop("all")
    measured, failed = int(total["episodes"]), int(total["env_errors"])
    assert measured + failed == PLAYED and 0 < failed < PLAYED, stdout
    assert heading == (
        f"PARTIAL EVALUATION: {failed} of {PLAYED} episodes ended in env_error; "
        f"the rates below count only the {measured} measured."
    )
    assert total["success_rate"].endswith(f"({measured} of {PLAYED} episodes, PARTIAL)")
    assert rows, "no group rows"
    assert sum(int(r["episodes"]) for r in rows.values()) == measured
    assert sum(int(r["env_errors"]) for r in rows.values()) == failed
    for row in rows.values():
        played = int(row["episodes"]) + int(row["env_errors"])
        if int(row["env_errors"]):
            assert row["success_rate"].endswith(
                f"({row['episodes']} of {played} episodes, PARTIAL)"
            )
        else:
            assert "PARTIAL" not in row["success_rate"]
    return measured, failed


def test_agentgym_eval_prints_and_writes_partial_with_counts_that_agree(
    tmp_path, tiny_model_dir, server, plugin_env
):
    config = _config(tmp_path, tiny_model_dir, server)
    out = tmp_path / "metrics.json"
    done = _agentgym(plugin_env, "eval", str(config), "--json", str(out))
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    measured, failed = _check_table(done.stdout)
    assert f"PARTIAL EVALUATION: {failed} of {PLAYED} episodes still ended in env_error" in (
        done.stderr
    )
    assert f"The metrics above count only the other {measured}." in done.stderr
    record = json.loads(out.read_text())
    assert list(record)[:3] == ["partial", "warning", "last_env_error"]
    assert record["partial"] is True and record["warning"].startswith("PARTIAL EVALUATION")
    assert (record["episodes"], record["env_errors"], record["episodes_played"]) == (
        measured,
        failed,
        PLAYED,
    )
    groups = {key.split("/")[1] for key in record if key.startswith("group/")}
    assert sum(record[f"group/{g}/env_errors"] for g in groups) == failed
    assert sum(record[f"group/{g}/episodes"] for g in groups) == measured


def test_an_eval_stage_says_partial_in_mlflow_and_in_the_viewer(
    tmp_path, tiny_model_dir, server, plugin_env
):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient
    from mlflow import MlflowClient

    from agentgym_core.tracking.mlflow_tracker import sqlite_uri
    from agentgym_core.view.app import create_app

    config = _config(tmp_path, tiny_model_dir, server, stages=[{"name": "exam", "type": "eval"}])
    done = _agentgym(plugin_env, "train", str(config), "--no-progress", "--quiet")
    assert done.returncode == 3, done.stdout[-3000:] + done.stderr[-3000:]
    assert "partial evaluation in stages exam" in done.stderr
    measured, failed = _check_table(done.stdout)

    run_dir = tmp_path / "run"
    client = MlflowClient(sqlite_uri(run_dir / "mlflow.db"))
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    metrics, tags = run.data.metrics, run.data.tags
    assert metrics["eval/test/partial"] == 1.0
    assert (metrics["eval/test/episodes"], metrics["eval/test/env_errors"]) == (measured, failed)
    assert tags["agentgym.eval.test.partial"] == "true"
    rate = metrics["eval/test/success_rate"]
    assert tags["agentgym.eval.test"] == (
        f"success {rate:.3f} over {measured} of {PLAYED} episodes: PARTIAL, {failed} env_error"
    )

    app = TestClient(create_app(run_dir, cache_dir=tmp_path / "view-cache"))
    overview = app.get("/").text
    assert "PARTIAL EVALUATION" in overview and f"{measured} of {PLAYED}" in overview
    assert f"{failed} of {PLAYED} episodes ended in env_error" in overview
    failed_page = app.get("/episodes", params={"termination": "env_error"}).text
    first = re.search(r'href="/episode/(\d+)"', failed_page)
    assert first, "no env_error episode logged"
    episode = app.get(f"/episode/{first[1]}").text
    assert "The environment failed" in episode and 'class="trace"' in episode
    assert "File " in episode and "agentgym_env_remote" in episode  # the client's frames
