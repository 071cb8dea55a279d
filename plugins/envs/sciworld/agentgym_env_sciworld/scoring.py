"""From ScienceWorld's score to agentgym's reward, done, truncated and success.

ScienceWorld scores an episode 0-100 with partial credit for subgoals, and sets
it to -100 when the agent does something that fails the task (focusing on the
wrong object). Rewards here are the change of the score clipped to [0, 100],
divided by 100, so the turn rewards of an episode add up to its final clipped
score / 100, in [0, 1]; a failing move takes back the partial credit earned
before it.
"""

from __future__ import annotations

from dataclasses import dataclass

SUCCESS_SCORE = 100


@dataclass(frozen=True)
class Outcome:
    """What one simulator step means for the agent."""

    reward: float
    done: bool
    truncated: bool
    success: bool


def score_of(raw: float) -> int:
    """The simulator's score in [-1, 1] as ScienceWorld reports it: an int, -100 to 100."""
    return int(round(100 * raw))


def outcome(
    previous: int, score: int, completed: bool, moves: int, max_moves: int | None
) -> Outcome:
    """Reward of a step from score `previous` to `score`; the episode ends as the package ends it.

    Done when the simulator says completed, when the score is negative (failed),
    or when more than `max_moves` moves were made (then also truncated, unless won; None: no
    limit).
    """
    clipped = min(max(score, 0), SUCCESS_SCORE)
    before = min(max(previous, 0), SUCCESS_SCORE)
    success = score >= SUCCESS_SCORE
    failed = score < 0
    out_of_moves = max_moves is not None and moves > max_moves
    done = completed or success or failed or out_of_moves
    truncated = out_of_moves and not (completed or success or failed)
    return Outcome((clipped - before) / SUCCESS_SCORE, done, truncated, success)
