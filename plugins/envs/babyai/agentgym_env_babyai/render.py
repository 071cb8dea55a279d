"""Our text renderer for BabyAI: short, regular sentences a small model can learn from."""

from __future__ import annotations

import json
from typing import Any

from agentgym_env_babyai.world import DIRECTIONS, Thing, relative


def _steps(n: int, word: str) -> str:
    return f"{n} step{'s' if n != 1 else ''} {word}"


def where(env: Any, pos: tuple[int, int]) -> str:
    """Position relative to the agent, e.g. `2 steps forward 1 step left`."""
    forward, right = relative(env, pos)
    parts = []
    if forward > 0:
        parts.append(_steps(forward, "forward"))
    elif forward < 0:
        parts.append(_steps(-forward, "behind"))
    if right > 0:
        parts.append(_steps(right, "right"))
    elif right < 0:
        parts.append(_steps(-right, "left"))
    return " ".join(parts) or "here"


def describe(thing: Thing) -> str:
    """`red ball 1`, or `locked blue door 1` for doors."""
    state = thing.door_state
    return f"{state} {thing.name}" if state else thing.name


def ahead(env: Any) -> str:
    """The first wall, door or object straight ahead."""
    x, y = int(env.agent_pos[0]), int(env.agent_pos[1])
    dx, dy = DIRECTIONS[env.agent_dir]
    for distance in range(1, max(env.grid.width, env.grid.height)):
        cell = env.grid.get(x + dx * distance, y + dy * distance)
        if cell is None:
            continue
        what = "a wall" if cell.type == "wall" else f"a {cell.color} {cell.type}"
        return f"Ahead: {what} {_steps(distance, 'forward')}."
    return "Ahead: nothing."


def observation(
    env: Any,
    seen: list[Thing],
    actions: list[str] | None,
    *,
    goal: bool,
    note: str = "",
) -> str:
    """The whole observation text of one turn."""
    lines = []
    if goal:
        lines.append(f"Your goal: {env.mission}")
    if note:
        lines.append(note)
    if seen:
        lines.append(
            "You see: " + ", ".join(f"{describe(t)} {where(env, t.pos)}" for t in seen) + "."
        )
    else:
        lines.append("You see: nothing.")
    carrying = env.carrying
    lines.append(
        f"You carry: {carrying.color} {carrying.type}." if carrying else "You carry: nothing."
    )
    lines.append(ahead(env))
    if actions is not None:
        lines.append("Available actions: " + json.dumps(actions))
    return "\n".join(lines)
