"""Options of the `openenv` environment: where the servers are and how their shapes map to text."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from agentgym_core.api import TaskList

PLACEHOLDERS = ("{task}", "{split}", "{index}")
"""What `reset` values may name: the task id, its split, its position in the split."""


class OpenEnvConfig(BaseModel):
    """An OpenEnv server (or replicas of one), its tasks, and how its shapes map to text."""

    model_config = ConfigDict(extra="forbid")

    base_urls: list[str] = Field(
        min_length=1,
        description="Base URL of each replica (http(s):// or ws(s)://, e.g. "
        "http://127.0.0.1:8000); each episode's session opens on the one with the fewest "
        "open sessions of this process.",
    )
    train_tasks: TaskList = Field(
        "server",
        description="Train task ids: a list, {start, stop}, or `server`: `GET /tasks` "
        "(`agentgym serve-env --protocol openenv` answers it; other OpenEnv servers do not).",
    )
    test_tasks: TaskList = Field("server", description="Test task ids, as `train_tasks`.")
    reset: dict[str, Any] = Field(
        default_factory=lambda: {"task_id": "{task}"},
        description="Keywords of each reset. A value `{task}`, `{split}` or `{index}` becomes "
        "the task id, its split, its position in the split; e.g. {seed: '{task}'} for an env "
        "whose tasks are seeds. Default: {task_id: '{task}'} (agentgym's servers).",
    )
    action_field: str | None = Field(
        None,
        description="The action field the agent's text goes in; null: the one string field of "
        "the server's `/schema` action.",
    )
    action_adapter: str | None = Field(
        None,
        description="`module:function` turning the agent's text into the action dict, for "
        "actions that are not one text field (see `adapters`).",
    )
    observation_field: str | None = Field(
        None,
        description="The observation field the agent reads; null: `text`, else the one string "
        "field, else the whole observation as JSON.",
    )
    actions_field: str | None = Field(
        None,
        description="A list-of-strings field with the valid actions (for constrained "
        "decoding); null: `available_actions` or `legal_actions` when the observation has one.",
    )
    observation_adapter: str | None = Field(
        None,
        description="`module:function` turning an observation dict into (text, actions or "
        "None); replaces observation_field and actions_field (see `adapters`).",
    )
    instruction: str | None = Field(
        None,
        description="Opening instruction; null: the server's `GET /metadata` description.",
    )
    success_reward: float = Field(
        0.0,
        description="An episode succeeded when it ends with a reward above this, unless the "
        "observation's metadata says `success`.",
    )
    task_group: str = Field(
        "openenv", description="Group label of tasks whose observation names none."
    )
    timeout_s: float = Field(60.0, gt=0, description="Seconds one reply may take.")
    connect_timeout_s: float = Field(10.0, gt=0, description="Seconds to open a session.")
    max_message_mb: float = Field(16.0, gt=0, description="Largest reply accepted, in MiB.")

    @field_validator("base_urls")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        clean = []
        for url in urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https", "ws", "wss") or not parts.netloc:
                raise ValueError(
                    f"{url!r} is not an http(s) or ws(s) URL such as http://127.0.0.1:8000"
                )
            clean.append(url.rstrip("/"))
        if len(set(clean)) != len(clean):
            raise ValueError(f"base_urls lists a server twice: {urls}")
        return clean

    @field_validator("action_adapter", "observation_adapter")
    @classmethod
    def _adapter(cls, path: str | None) -> str | None:
        if path is not None and (path.count(":") != 1 or not all(path.split(":"))):
            raise ValueError(f"{path!r} is not `module:function`, e.g. my_pkg.adapters:to_action")
        return path

    @model_validator(mode="after")
    def _one_action_mapping(self) -> OpenEnvConfig:
        if self.action_field and self.action_adapter:
            raise ValueError("set action_field or action_adapter, not both")
        return self


def render(template: dict[str, Any], task_id: int, split: str, index: int) -> dict[str, Any]:
    """The reset keywords for a task: placeholders replaced (a whole placeholder keeps its type)."""
    values = {"{task}": task_id, "{split}": split, "{index}": index}
    out: dict[str, Any] = {}
    for key, value in template.items():
        if isinstance(value, str) and value in values:
            out[key] = values[value]
        elif isinstance(value, str):
            for name, filled in values.items():
                value = value.replace(name, str(filled))
            out[key] = value
        else:
            out[key] = value
    return out
