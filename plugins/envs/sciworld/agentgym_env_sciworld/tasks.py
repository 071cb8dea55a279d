"""ScienceWorld's task types and how (task type, variation) pairs become integer task ids.

Ids are `type_index * 10_000 + variation`, where `type_index` is the position
of the type in ScienceWorld's own catalogue (`1-1 boil` is 0, `10-2
mendelian-genetics-unknown-plant` is 29). The index does not depend on which
types a config selects, so an id means the same episode in every config. The
largest type has 1,386 variations, well under the stride.
"""

from __future__ import annotations

from scienceworld.constants import ID2TASK

VARIATION_STRIDE = 10_000
"""Task id = type index * stride + variation."""

TASK_TYPES: tuple[str, ...] = tuple(ID2TASK.values())
"""Every task type, in ScienceWorld's catalogue order (`1-1` first)."""

TYPE_BY_NUMBER: dict[str, str] = dict(ID2TASK)
"""ScienceWorld's numbers (`"4-1"`) to type names (`"find-living-thing"`)."""

AGENTGYM_EXCLUDED = ("5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2")
"""Types AgentGym's SciWorld server leaves out: growing plants and fruit, inclined planes,
Mendelian genetics. Their gold paths run to 70-160 actions, far past a 30-turn horizon."""

DEFAULT_TASK_TYPES: tuple[str, ...] = tuple(
    name for number, name in ID2TASK.items() if number not in AGENTGYM_EXCLUDED
)
"""The 23 types AgentGym trains and evaluates on."""

SPLITS = ("train", "dev", "test")
"""ScienceWorld's own variation splits."""


def resolve_type(name_or_number: str) -> str:
    """The type name of `"boil"` or `"1-1"`; a ValueError lists the valid names otherwise."""
    if name_or_number in TYPE_BY_NUMBER:
        return TYPE_BY_NUMBER[name_or_number]
    if name_or_number in TASK_TYPES:
        return name_or_number
    raise ValueError(
        f"unknown ScienceWorld task type {name_or_number!r}; valid types: {', '.join(TASK_TYPES)}"
        " (or their numbers, e.g. 1-1)"
    )


def encode(task_type: str, variation: int) -> int:
    """The task id of `variation` of `task_type`."""
    if not 0 <= variation < VARIATION_STRIDE:
        raise ValueError(f"variation {variation} out of range 0..{VARIATION_STRIDE - 1}")
    return TASK_TYPES.index(task_type) * VARIATION_STRIDE + variation


def decode(task_id: int) -> tuple[str, int]:
    """(task type, variation) of a task id; a ValueError names the bad id."""
    index, variation = divmod(int(task_id), VARIATION_STRIDE)
    if task_id < 0 or index >= len(TASK_TYPES):
        raise ValueError(
            f"task id {task_id} is not a ScienceWorld task: ids are type_index * "
            f"{VARIATION_STRIDE} + variation with type_index 0..{len(TASK_TYPES) - 1}"
        )
    return TASK_TYPES[index], variation
