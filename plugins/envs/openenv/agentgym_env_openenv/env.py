"""The `openenv` environment: each episode is a `/ws` session on an OpenEnv server.

An instance keeps one session open across its episodes (a reset starts the
next one on it) and opens a new one, on the least busy replica, after a
fault. The action schema is read once from `GET /schema`, the task lists
(when `server`) from `GET /tasks`, the instruction from `GET /metadata`.
"""

from __future__ import annotations

from typing import Any

import httpx

from agentgym_core.api import StepResult, listed_tasks
from agentgym_env_openenv.adapters import (
    ObservationReader,
    action_field_from_schema,
    load,
)
from agentgym_env_openenv.config import OpenEnvConfig, render
from agentgym_env_openenv.connection import OpenEnvServerError, Session, http_url, least_busy

REFUSED_ACTION_CODES = ("VALIDATION_ERROR",)
"""Error codes of a step that mean "this action is not valid": the agent is told, the episode
goes on (an invalid action gets an observation, not an exception)."""


class OpenEnvEnv:
    """An Environment whose episodes run on an OpenEnv server."""

    def __init__(self, config: OpenEnvConfig) -> None:
        self.config = config
        self._session: Session | None = None
        self._tasks: dict[str, list[int]] = {}
        self._instruction: str | None = config.instruction
        self._action_field = config.action_field
        self._to_action = (
            load(config.action_adapter, "action_adapter") if config.action_adapter else None
        )
        self._read = (
            load(config.observation_adapter, "observation_adapter")
            if config.observation_adapter
            else ObservationReader(config.observation_field, config.actions_field)
        )
        self._groups: dict[int, str] = {}
        self._actions: list[str] | None = None
        self._done = True

    # -- what the env offers ------------------------------------------------------------

    def tasks(self, split: str) -> list[int]:
        """The configured task ids of `split`, or the server's (`GET /tasks`)."""
        if split not in ("train", "test"):
            raise ValueError(f"unknown split {split!r}; splits: train, test")
        if split not in self._tasks:
            spec = self.config.train_tasks if split == "train" else self.config.test_tasks
            self._tasks[split] = listed_tasks(spec, lambda: self._server_tasks(split))
        return self._tasks[split]

    def _server_tasks(self, split: str) -> list[int]:
        reply = self._get("/tasks", f"env.{split}_tasks is `server`", params={"split": split})
        tasks = reply.get("tasks") if isinstance(reply, dict) else None
        if not isinstance(tasks, list) or not all(isinstance(t, int) for t in tasks):
            raise OpenEnvServerError(f"GET /tasks: expected {{'tasks': [int, ...]}}, got {reply!r}")
        return tasks

    def instruction(self) -> str:
        """`env.instruction`, else the server's `/metadata` description."""
        if self._instruction is None:
            reply = self._get("/metadata", "env.instruction is null")
            description = reply.get("description") if isinstance(reply, dict) else None
            self._instruction = description if isinstance(description, str) else ""
        return self._instruction

    def task_group(self, task_id: int) -> str:
        """The task's group as its observation named it, else `env.task_group`."""
        return self._groups.get(task_id, self.config.task_group)

    def valid_actions(self) -> list[str] | None:
        """The actions the last observation listed (None: not listed)."""
        return None if self._done else self._actions

    # -- episodes ----------------------------------------------------------------------

    def reset(self, task_id: int) -> str:
        """Start `task_id` on this instance's session (opened first when there is none)."""
        self._done = True
        self._resolve_action_field()
        keywords = render(self.config.reset, task_id, *self._place(task_id))
        reply = self._exchange("reset", keywords)
        observation = _observation(reply)
        text, self._actions = self._read(observation)
        group = observation.get("task_group")
        if isinstance(group, str):
            self._groups[task_id] = group
        self._done = bool(reply.get("done", False))
        return text

    def step(self, action: str) -> StepResult:
        """Send the agent's text as the action; a refused action is told, not raised."""
        if self._done:
            raise OpenEnvServerError("step() before reset() or after the episode ended")
        try:
            reply = self._exchange("step", self._payload(action))
        except OpenEnvServerError as error:
            if error.code not in REFUSED_ACTION_CODES:
                raise
            return StepResult(f"Invalid action: {error}", 0.0, False, info={"success": False})
        observation = _observation(reply)
        text, actions = self._read(observation)
        reward = float(reply.get("reward") or 0.0)
        done = bool(reply.get("done", False))
        metadata = observation.get("metadata") if isinstance(observation, dict) else None
        metadata = metadata if isinstance(metadata, dict) else {}
        truncated = bool(metadata.get("truncated", False))
        success = metadata.get("success")
        if not isinstance(success, bool):
            success = done and reward > self.config.success_reward
        self._done = done or truncated
        self._actions = None if self._done else actions
        info = {"success": success}
        if isinstance(metadata.get("info"), dict):
            info = {**metadata["info"], "success": success}
        return StepResult(text, reward, done, truncated and not done, info)

    def close(self) -> None:
        """Close the session (idempotent)."""
        if self._session is not None:
            self._session.close()
            self._session = None

    # -- the session and its faults --------------------------------------------------------

    def _exchange(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        if self._session is None or not self._session.open:
            config = self.config
            self._session = Session(
                least_busy(config.base_urls),
                connect_timeout_s=config.connect_timeout_s,
                timeout_s=config.timeout_s,
                max_message_mb=config.max_message_mb,
            )
        try:
            return self._session.exchange(kind, data)
        except OpenEnvServerError as error:
            if error.code is None or kind == "reset":  # lost, or the episode cannot start
                self.close()
            raise

    def _payload(self, action: str) -> dict[str, Any]:
        if self._to_action is not None:
            payload = self._to_action(action)
            if not isinstance(payload, dict):
                raise TypeError(
                    f"env.action_adapter returned {type(payload).__name__}, not the action dict"
                )
            return payload
        return {self._resolve_action_field(): action}

    def _resolve_action_field(self) -> str | None:
        """The action's text field: configured, or read once from `GET /schema`."""
        if self._action_field is None and self._to_action is None:
            schema = self._get("/schema", "env.action_field is null")
            action_schema = schema.get("action", {}) if isinstance(schema, dict) else {}
            self._action_field = action_field_from_schema(action_schema, self._base())
        return self._action_field

    def _place(self, task_id: int) -> tuple[str, int]:
        """`task_id`'s split and position in it (`train`, the id itself when in neither)."""
        for split in ("train", "test"):
            ids = self.tasks(split)
            if task_id in ids:
                return split, ids.index(task_id)
        return "train", task_id

    def _base(self) -> str:
        return http_url(self.config.base_urls[0])

    def _get(self, path: str, why: str, **kwargs: Any) -> Any:
        url = self._base() + path
        try:
            reply = httpx.get(url, timeout=self.config.timeout_s, **kwargs)
            reply.raise_for_status()
            return reply.json()
        except (httpx.HTTPError, ValueError) as error:
            raise OpenEnvServerError(f"{why}, but GET {url} failed: {error}") from error


def _observation(reply: dict[str, Any]) -> dict[str, Any]:
    observation = reply.get("observation")
    if not isinstance(observation, dict):
        raise OpenEnvServerError(f"a reply without an observation object: {reply!r}"[:300])
    return observation
