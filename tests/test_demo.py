"""`make demo`'s script, shrunk: it ends with the viewer command, on every evaluation episode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_demo_logs_every_evaluation_episode_and_says_how_to_view_them(tmp_path):
    workdir = tmp_path / "demo"
    command = [sys.executable, str(ROOT / "examples" / "babyai_demo.py"), "--workdir", str(workdir)]
    command += ["--size", "hidden_size=32", "--size", "num_layers=1"]
    command += ["trainer.steps=2", "trainer.tasks_per_step=2", "trainer.group_size=2"]
    command += ["eval.num_tasks=10", "trainer.checkpoint_every=2", "tracking.traces=false"]
    command += ["scheduler.stages=[{until_step: 2, max_turns: 3}]"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    last = done.stdout.strip().splitlines()[-1]
    said = "every evaluation episode, before and after, turn by turn: agentgym view"
    assert last == f"{said} {workdir / 'run'}"
    evaluations = sorted((workdir / "run").rglob("trajectories/test/step-*.jsonl"))
    assert len(evaluations) == 2  # before and after
    for path in evaluations:
        episodes = [json.loads(line) for line in path.read_text().splitlines()]
        assert len(episodes) == 10, path  # every one, not log_trajectories' 4
        assert sum(bool(e["frames"]) for e in episodes) == 2, path  # tracking.frames
