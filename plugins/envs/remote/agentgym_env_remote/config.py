"""Options of the `remote` environment."""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agentgym_core.api import TaskList
from agentgym_env_remote.dialects import DIALECTS

Tasks = TaskList


class RemoteConfig(BaseModel):
    """Where the AgentGym servers are, which variant they speak, and how patient to be."""

    model_config = ConfigDict(extra="forbid")

    env: str = Field(
        description="Which server: "
        + ", ".join(DIALECTS)
        + " (`agentgym`: any env behind `agentgym serve-env`)."
    )
    base_urls: list[str] = Field(
        min_length=1,
        description="Base URL of each replica, e.g. http://127.0.0.1:36001; new env ids go to "
        "the replica with the fewest open ones.",
    )
    train_tasks: Tasks = Field(
        "server",
        description="Train task ids: a list, {start, stop}, or `server`: ask the server's "
        "`GET /tasks` (`agentgym serve-env` answers it, AgentGym's servers do not).",
    )
    test_tasks: Tasks = Field("server", description="Test task ids, as `train_tasks`.")
    timeout_s: float = Field(
        60.0, gt=0, description="Seconds one request may take (AgentGym's servers: one worker)."
    )
    connect_timeout_s: float = Field(5.0, gt=0, description="Seconds to open a connection.")
    max_concurrency: int = Field(
        16, gt=0, description="Requests in flight per server at once (and pooled connections)."
    )
    instruction: str | None = Field(
        None,
        description="Opening instruction; null: AgentGym's prompt for `env` (babyai, sciworld, "
        "textcraft, searchqa), else the server's `GET /instruction`.",
    )
    action_format: Literal["agentgym", "raw"] = Field(
        "agentgym",
        description="`agentgym`: parse the action as AgentGym's client for `env` does (text "
        "after `Action:`); `raw`: send the model's text as is.",
    )
    list_actions: bool = Field(
        True,
        description="Offer the actions the server lists (`available_actions`, or BabyAI's "
        "`Available actions: [...]` line) to constrained decoding.",
    )
    recycle_after: int = Field(
        0,
        ge=0,
        description="Close and recreate the env id after this many episodes (servers that "
        "leak, like WebShop's); 0: keep it.",
    )
    retry_503: int = Field(
        3, ge=0, description="Retries of a request answered 503 (busy), 0.2 s apart."
    )

    @field_validator("env")
    @classmethod
    def _known(cls, env: str) -> str:
        if env not in DIALECTS:
            raise ValueError(f"unknown server kind {env!r}; known: {', '.join(DIALECTS)}")
        return env

    @field_validator("base_urls")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        clean = []
        for url in urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"{url!r} is not an http(s) URL such as http://127.0.0.1:36001")
            clean.append(url.rstrip("/"))
        if len(set(clean)) != len(clean):
            raise ValueError(f"base_urls lists a server twice: {urls}")
        return clean
