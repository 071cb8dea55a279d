"""Task lists an env config states, for envs whose tasks live elsewhere (a server).

An env that plays on a server (AgentGym's, OpenEnv's) cannot always ask it
for its task ids: the config then lists them, or gives a range. `TaskList` is
that option's type (`list[int] | TaskRange | "server"`) and `listed_tasks`
resolves it, asking the server only for `"server"`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TaskRange(BaseModel):
    """Task ids `start`, `start + 1`, ..., `stop - 1`."""

    model_config = ConfigDict(extra="forbid")

    start: int = Field(0, ge=0, description="First task id.")
    stop: int = Field(gt=0, description="One past the last task id.")

    @model_validator(mode="after")
    def _ordered(self) -> TaskRange:
        if self.stop <= self.start:
            raise ValueError(f"stop ({self.stop}) must be greater than start ({self.start})")
        return self

    def ids(self) -> list[int]:
        """The ids as a list."""
        return list(range(self.start, self.stop))


TaskList = list[int] | TaskRange | Literal["server"]
"""A split's tasks in an env config: a list, `{start, stop}`, or `server` (ask it)."""


def listed_tasks(spec: TaskList, from_server: Callable[[], list[int]]) -> list[int]:
    """The task ids `spec` names; `from_server()` only when it says `server`."""
    if isinstance(spec, TaskRange):
        return spec.ids()
    if isinstance(spec, list):
        return list(spec)
    return from_server()
