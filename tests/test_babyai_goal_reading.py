"""`benchmarks/babyai_goal_reading.py`: which object an episode's first object action names."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agentgym_core.run.saved_rollouts import save_rollouts  # noqa: E402
from agentgym_core.types import Trajectory, Turn  # noqa: E402
from benchmarks.babyai_goal_reading import classify, count, first_target, goal_object  # noqa: E402


def test_goals_and_first_targets_are_read_as_agentgym_writes_them():
    assert goal_object("Your goal: go to the red ball\nIn front of you...") == ("red", "ball")
    assert goal_object("Your goal: pick up a key\nIn front of you...") == (None, "key")
    assert goal_object("Your goal: open a door\n...") is None
    assert goal_object("Your goal: put the red ball next to the blue box\n...") is None
    actions = ["turn left", "go through red open door 1", "pickup blue box 2", "go to red ball 1"]
    assert first_target(actions) == ("blue", "box")
    assert first_target(["turn left", "toggle"]) is None
    assert classify(("red", "ball"), ("red", "ball")) == "goal"
    assert classify(("red", "ball"), ("red", "box")) == "other"  # the colour alone is not enough
    assert classify(("red", "ball"), ("blue", "ball")) == "other"
    assert classify((None, "key"), ("grey", "key")) == "goal"  # any key, where none is named
    assert classify((None, "key"), None) == "none"


def test_counts_come_from_saved_episodes_and_agenttraj_files(tmp_path):
    def episode(goal: str, actions: list[str], won: bool) -> Trajectory:
        turns = [Turn(action, "You see: a wall.", 0.0) for action in actions]
        first = f"Your goal: {goal}\nx"
        return Trajectory(task_id=0, group=0, turns=turns, success=won, first_observation=first)

    episodes = [
        episode("go to a red box", ["go to red ball 1", "drop"], False),
        episode("go to a red box", ["go to red box 1"], True),
        episode("pick up the key", ["turn left"], False),
        episode("open a door", ["toggle"], True),  # not a one-object goal: not counted
    ]
    rollouts = save_rollouts(tmp_path / "eval-test.jsonl", episodes)  # as `agentgym eval --out`
    assert count(rollouts) == {("lost", "other"): 1, ("won", "goal"): 1, ("lost", "none"): 1}
    expert = tmp_path / "expert.json"
    conversation = [
        {"from": "human", "loss": None, "value": "Go."},
        {"from": "gpt", "loss": False, "value": "Ok."},
        {"from": "human", "loss": None, "value": "Your goal: go to the blue key\nx"},
        {"from": "gpt", "loss": False, "value": "go to red ball 1"},  # a roll-in's turn
        {"from": "human", "loss": None, "value": "y"},
        {"from": "gpt", "loss": True, "value": "go to blue key 1"},
    ]
    expert.write_text(json.dumps([{"item_id": "babyai_1", "conversations": conversation}]))
    assert count(expert) == {("won", "goal"): 1}
