"""A multi-turn environment written only with `openenv`'s own server classes.

Not ours: it subclasses OpenEnv's `Environment`, `Action`, `Observation` and
`State`, and `openenv.core.create_app` serves it, as a third party would
publish one. The agent walks a number line from 0 to a target drawn by the
reset's seed, one `left` or `right` per turn; reaching it ends the episode
with reward 1, and `max_moves` moves without reaching it end it with 0.
The action has one field (`move`), the observation's text is `prompt` and its
valid actions `legal_moves`: the consuming env must find them itself or be told.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from openenv.core import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

MAX_MOVES = 4


class MoveAction(Action):
    move: str


class LineObservation(Observation):
    prompt: str
    legal_moves: list[str]


class LineWorld(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=None, step_count=0)
        self.position = self.target = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any):
        self.target = random.Random(seed).choice([-2, -1, 1, 2])
        self.position = 0
        self._state = State(episode_id=episode_id or uuid.uuid4().hex, step_count=0)
        return self._observe(f"You are at 0. Reach {self.target}.", reward=None, done=False)

    def step(self, action: MoveAction, timeout_s: float | None = None, **_: Any):
        self._state.step_count += 1
        move = action.move.strip()
        if move == "left":
            self.position -= 1
        elif move == "right":
            self.position += 1
        reached = self.position == self.target
        done = reached or self._state.step_count >= MAX_MOVES
        said = f"You are at {self.position}. Reach {self.target}."
        if move not in ("left", "right"):
            said = f"Unknown move {move!r}. " + said
        return self._observe(said, reward=1.0 if reached else 0.0, done=done)

    @property
    def state(self) -> State:
        return self._state

    def _observe(self, prompt: str, *, reward: float | None, done: bool) -> LineObservation:
        return LineObservation(
            prompt=prompt, legal_moves=["left", "right"], reward=reward, done=done
        )


def line_world_app(max_sessions: int = 64):
    """OpenEnv's own FastAPI app for `LineWorld`."""
    return create_app(
        LineWorld,
        MoveAction,
        LineObservation,
        env_name="line_world",
        max_concurrent_envs=max_sessions,
    )
