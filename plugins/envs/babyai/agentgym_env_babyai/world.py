"""What the agent can see in a minigrid world, and paths to act on it.

Objects get stable names for the whole episode: colour, type and an index
among objects of that colour and type ("red ball 1"), as AgentGym names them.
Macro actions ("go to red ball 1") are planned by breadth-first search over
(position, direction) states, so they end facing the object, which is what
BabyAI's GoTo, Pickup and Open instructions verify.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

LEFT, RIGHT, FORWARD, PICKUP, DROP, TOGGLE = 0, 1, 2, 3, 4, 5
DIRECTIONS = [(1, 0), (0, 1), (-1, 0), (0, -1)]
OBJECT_TYPES = ("key", "ball", "box", "door")
COLOURS = ("red", "green", "blue", "purple", "yellow", "grey")
"""Minigrid's colours. The dynamics ignore them but for matching a key to its door, so a
consistent permutation of them keeps an episode valid (`interchangeable_words`). Object
types are not interchangeable: keys open doors, and AgentGym's text calls boxes barriers."""


@dataclass(frozen=True)
class Thing:
    """A named object of the current episode."""

    name: str
    type: str
    pos: tuple[int, int]
    obj: Any

    @property
    def door_state(self) -> str:
        """`open`, `closed` or `locked` for doors, '' otherwise."""
        if self.type != "door":
            return ""
        if self.obj.is_open:
            return "open"
        return "locked" if self.obj.is_locked else "closed"


def name_objects(env: Any) -> dict[str, Thing]:
    """Every key, ball, box and door of the grid, named `<colour> <type> <n>`."""
    counts: dict[tuple[str, str], int] = {}
    things: dict[str, Thing] = {}
    grid = env.grid
    for y in range(grid.height):
        for x in range(grid.width):
            obj = grid.get(x, y)
            if obj is None or obj.type not in OBJECT_TYPES:
                continue
            key = (obj.color, obj.type)
            counts[key] = counts.get(key, 0) + 1
            name = f"{obj.color} {obj.type} {counts[key]}"
            things[name] = Thing(name, obj.type, (x, y), obj)
    return things


def visible(env: Any, things: dict[str, Thing]) -> list[Thing]:
    """Things in the agent's field of view and not hidden behind walls."""
    _, mask = env.gen_obs_grid()
    seen = []
    for thing in things.values():
        obj_now = env.grid.get(*thing.pos)
        if obj_now is not thing.obj:
            continue  # carried or moved
        coords = env.relative_coords(*thing.pos)
        if coords is not None and mask[coords[0], coords[1]]:
            seen.append(thing)
    return seen


def relative(env: Any, pos: tuple[int, int]) -> tuple[int, int]:
    """(steps forward, steps right) from the agent to `pos`."""
    dx, dy = pos[0] - int(env.agent_pos[0]), pos[1] - int(env.agent_pos[1])
    fx, fy = DIRECTIONS[env.agent_dir]
    rx, ry = -fy, fx
    return dx * fx + dy * fy, dx * rx + dy * ry


def _passable(env: Any, x: int, y: int) -> bool:
    cell = env.grid.get(x, y)
    return cell is None or (cell.type == "door" and cell.is_open)


def plan_to_face(env: Any, target: tuple[int, int], *, through: bool = False) -> list[int] | None:
    """Shortest primitive actions that end facing `target` (or standing on it if `through`)."""
    start = (int(env.agent_pos[0]), int(env.agent_pos[1]), int(env.agent_dir))
    parents: dict[tuple[int, int, int], tuple[tuple[int, int, int], int] | None] = {start: None}
    queue = deque([start])
    while queue:
        state = queue.popleft()
        x, y, d = state
        fx, fy = x + DIRECTIONS[d][0], y + DIRECTIONS[d][1]
        reached = (x, y) == target if through else (fx, fy) == target
        if reached:
            actions = []
            while parents[state] is not None:
                state, action = parents[state]
                actions.append(action)
            return actions[::-1]
        moves = [((x, y, (d - 1) % 4), LEFT), ((x, y, (d + 1) % 4), RIGHT)]
        if 0 <= fx < env.grid.width and 0 <= fy < env.grid.height and _passable(env, fx, fy):
            moves.append(((fx, fy, d), FORWARD))
        for nxt, action in moves:
            if nxt not in parents:
                parents[nxt] = (state, action)
                queue.append(nxt)
    return None


def free_cells_next_to(env: Any, pos: tuple[int, int]) -> list[tuple[int, int]]:
    """Empty floor cells orthogonally adjacent to `pos`."""
    cells = []
    for dx, dy in DIRECTIONS:
        x, y = pos[0] + dx, pos[1] + dy
        if 0 <= x < env.grid.width and 0 <= y < env.grid.height and env.grid.get(x, y) is None:
            cells.append((x, y))
    return cells
