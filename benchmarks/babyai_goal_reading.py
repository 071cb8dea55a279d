"""Does a BabyAI agent read its goal? Which object its first object action names, and wins.

For episodes of AgentGym's BabyAI whose goal names one object to go to or pick up
("go to the red ball", "pick up a key"), the first `go to`/`pickup` action names the
goal's object (its type, and its colour where the goal gives one), another object, or
none; counted with the episode's outcome. Reads saved episodes (`agentgym eval --out
DIR` writes `DIR/eval/rollouts/eval-<split>.jsonl`) or AgentTraj files (an SFT stage's
`expert.json`, whose episodes all won):

    python benchmarks/babyai_goal_reading.py DIR/eval/rollouts/eval-test.jsonl expert.json
"""

from __future__ import annotations

import argparse
import collections
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from agentgym_env_babyai.world import COLOURS as COLOUR_NAMES

from agentgym_core.data.agenttraj import read_items
from agentgym_core.data.trajfiles import read_jsonl as read_rollout_file

COLOURS = "|".join(COLOUR_NAMES)
GOAL = re.compile(rf"^Your goal: (?:go to|pick up) (?:the|a) (?:({COLOURS}) )?(ball|box|key)$")
OBJECT_ACTION = re.compile(rf"^(?:go to|pickup) ({COLOURS}) (ball|box|key) \d+$")


def goal_object(first_observation: str) -> tuple[str | None, str] | None:
    """(colour or None, type) of a goal naming one object; None for other goals."""
    match = GOAL.match(first_observation.split("\n", 1)[0])
    return (match.group(1), match.group(2)) if match else None


def first_target(actions: Iterable[str]) -> tuple[str, str] | None:
    """(colour, type) named by the first `go to`/`pickup` of a ball, box or key."""
    for action in actions:
        match = OBJECT_ACTION.match(action.strip())
        if match:
            return match.group(1), match.group(2)
    return None


def classify(goal: tuple[str | None, str], target: tuple[str, str] | None) -> str:
    """`goal`, `other` or `none`: what the first object action named."""
    if target is None:
        return "none"
    colour, kind = goal
    return "goal" if target[1] == kind and colour in (None, target[0]) else "other"


def episodes(path: Path) -> Iterator[tuple[str, list[str], bool]]:
    """(first observation, actions, won) of each episode in a rollouts JSONL or AgentTraj file."""
    if path.suffix == ".jsonl":
        for episode in read_rollout_file(path):
            yield episode.first_observation, [t.action for t in episode.turns], episode.success
        return
    for item in read_items(path):
        turns = item.conversations[2:]  # after the instruction and its "Ok."
        yield turns[0].value, [t.value for t in turns if t.trains], True


def count(path: Path) -> collections.Counter:
    """(outcome, first object) -> episodes, over the episodes whose goal names one object."""
    counts: collections.Counter = collections.Counter()
    for first_observation, actions, won in episodes(path):
        goal = goal_object(first_observation)
        if goal is not None:
            counts["won" if won else "lost", classify(goal, first_target(actions))] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    for path in parser.parse_args().files:
        counts = count(path)
        total = sum(counts.values())
        print(f"{path}: {total} episodes whose goal names one object")
        for first in ("goal", "other", "none"):
            won, lost = counts["won", first], counts["lost", first]
            print(f"  first object action names {first:5}: {won + lost:4} ({won} won, {lost} lost)")


if __name__ == "__main__":
    main()
