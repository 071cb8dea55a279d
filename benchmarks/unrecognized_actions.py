"""Where free-text actions go wrong: turns the env did not recognise, and the episodes they cost.

Reads saved episodes (`agentgym eval --out DIR` writes `DIR/eval/rollouts/eval-<split>.jsonl`)
and counts the turns whose reply says the action was not recognised (AgentGym's BabyAI
answers "The action is not recognized"), the episodes with any, the lost episodes with
any, and the actions written most often:

    python benchmarks/unrecognized_actions.py DIR/eval/rollouts/eval-test.jsonl
"""

from __future__ import annotations

import argparse
import collections
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym_core.data.trajfiles import read_jsonl as read_rollout_file
from agentgym_core.types import Trajectory

REFUSAL = "not recognized"
"""What AgentGym's BabyAI server answers an action that is not available."""


def count(episodes: Sequence[Trajectory], refusal: str = REFUSAL) -> dict[str, Any]:
    """Turns, refused turns, episodes with one, lost episodes with one, common refused actions."""
    refused = collections.Counter()
    turns = refused_turns = with_refusal = lost = lost_with_refusal = 0
    for episode in episodes:
        bad = [turn.action for turn in episode.turns if refusal in turn.observation]
        turns += len(episode.turns)
        refused_turns += len(bad)
        refused.update(bad)
        with_refusal += bool(bad)
        if not episode.success:
            lost += 1
            lost_with_refusal += bool(bad)
    return {
        "episodes": len(episodes),
        "turns": turns,
        "refused_turns": refused_turns,
        "episodes_with_refusal": with_refusal,
        "lost": lost,
        "lost_with_refusal": lost_with_refusal,
        "most_refused": refused.most_common(10),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rollouts", type=Path, help="an eval-<split>.jsonl of saved episodes")
    args = parser.parse_args()
    print(json.dumps(count(read_rollout_file(args.rollouts)), indent=1))


if __name__ == "__main__":
    main()
