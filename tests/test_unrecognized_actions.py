"""benchmarks/unrecognized_actions.py counts refused turns and the episodes they touch."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from agentgym_core.run.saved_rollouts import save_rollouts
from agentgym_core.types import Trajectory, Turn

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "unrecognized_actions.py"
REFUSED = "The action is not recognized. Please check valid actions."


def _module():
    spec = importlib.util.spec_from_file_location("unrecognized_actions", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _episode(actions_refused, success):
    turns = [
        Turn(action, REFUSED if refused else "You see: a wall.", 0.0)
        for action, refused in actions_refused
    ]
    return Trajectory(task_id=0, group=0, turns=turns, success=success)


EPISODES = [
    _episode([("go to red ball 1", True), ("go to red ball 1", True), ("turn left", False)], False),
    _episode([("toggle", True), ("go to grey key 1", False)], True),
    _episode([("turn right", False)], False),
    _episode([("go to grey key 1", False)], True),
]


def test_refused_turns_and_the_episodes_they_touch():
    counted = _module().count(EPISODES)
    assert counted["episodes"] == 4 and counted["turns"] == 7
    assert counted["refused_turns"] == 3
    assert counted["episodes_with_refusal"] == 2
    assert counted["lost"] == 2 and counted["lost_with_refusal"] == 1
    assert counted["most_refused"] == [("go to red ball 1", 2), ("toggle", 1)]


def test_the_command_reads_saved_episodes(tmp_path):
    path = save_rollouts(tmp_path / "eval-test.jsonl", EPISODES)  # as `agentgym eval --out`
    out = subprocess.run(
        [sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout)["lost_with_refusal"] == 1
