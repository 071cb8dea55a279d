"""The `remote` environment: one env id on an AgentGym server per instance.

Infrastructure faults raise `RemoteEnvError`, so the rollout engine ends the
episode as `env_error`; the instance then forgets its env id and the next
`reset` creates a fresh one (on the least busy replica). The engine also
closes an instance that raised and makes a new one; both paths recover.
A server restart is such a fault even when no request failed: every call
names the server life its env id came from (see `client`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from agentgym_core.api import StepResult, listed_tasks
from agentgym_env_remote.client import (
    CLOSE_TIMEOUT_S,
    RemoteEnvError,
    ServerUnreachable,
    SessionLost,
    acquire_pool,
    release_pool,
)
from agentgym_env_remote.config import RemoteConfig
from agentgym_env_remote.dialects import DIALECTS, ProtocolError, Reply
from agentgym_env_remote.prompts import ActionRejected, listed_actions, raw_action

TIMEOUT_OBSERVATION = "TimeoutError"
"""WebArena's reset answers this string as its observation when a page did not load."""


class RemoteEnv:
    """An Environment whose episodes run on an AgentGym env server."""

    def __init__(self, config: RemoteConfig) -> None:
        self.config = config
        self.dialect = DIALECTS[config.env]
        self._pool_key = (
            tuple(config.base_urls),
            config.timeout_s,
            config.connect_timeout_s,
            config.max_concurrency,
            config.retry_503,
        )
        self.pool = acquire_pool(
            self._pool_key,
            urls=list(config.base_urls),
            timeout_s=config.timeout_s,
            connect_timeout_s=config.connect_timeout_s,
            max_concurrency=config.max_concurrency,
            retry_503=config.retry_503,
        )
        self.server: str | None = None
        self.env_id: int | None = None
        self._instance: str | None = None
        """The `X-AgentGym-Instance` the env id came from (None: the server sends none)."""
        self._generation = 0
        self._episodes_on_id = 0
        self._score = 0.0
        self._actions: list[str] | None = None
        self._done = True
        self._groups: dict[int, str] = {}
        self._tasks: dict[str, list[int]] = {}
        self._instruction: str | None = None
        self._closed = False

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
        url = self.pool.urls[0]
        try:
            reply = self.pool.request(url, "GET", "/tasks", params={"split": split})
        except RemoteEnvError as error:
            raise RemoteEnvError(
                f"env.{split}_tasks is `server`, but {error}; AgentGym's own servers do not "
                f"list tasks: set env.{split}_tasks to a list or {{start, stop}}"
            ) from error
        tasks = reply.get("tasks") if isinstance(reply, dict) else None
        if not isinstance(tasks, list) or not all(isinstance(t, int) for t in tasks):
            raise RemoteEnvError(
                f"GET {url}/tasks: expected {{'tasks': [int, ...]}}, got {reply!r}"
            )
        return tasks

    def instruction(self) -> str:
        """`env.instruction`, else AgentGym's prompt for this env, else the server's own."""
        if self._instruction is None:
            self._instruction = self.config.instruction or self.dialect.instruction
        if self._instruction is None:
            url = self.pool.urls[0]
            try:
                reply = self.pool.request(url, "GET", "/instruction")
                self._instruction = str(reply["instruction"])
            except (RemoteEnvError, KeyError, TypeError) as error:
                raise RemoteEnvError(
                    f"no instruction for env {self.config.env!r}: none is built in and "
                    f"GET {url}/instruction failed ({error}); set env.instruction"
                ) from error
        return self._instruction

    def counters(self) -> dict[str, float]:
        """Per server of the shared pool: env ids opened, failed requests, seconds down, restarts.

        Cumulative over the run; the trainer logs them as `env/server/<host_port>/...`.
        """
        return self.pool.counters()

    def task_group(self, task_id: int) -> str:
        """The server's `task_group` of the task, when it sent one; else the env kind."""
        return self._groups.get(task_id, self.config.env)

    def valid_actions(self) -> list[str] | None:
        """The actions the server listed with the last observation (None: not enumerable)."""
        return None if self._done or not self.config.list_actions else self._actions

    # -- episodes ----------------------------------------------------------------------

    def reset(self, task_id: int) -> str:
        """Start `task_id`, creating (or recycling) the env id first when needed.

        An id on a replica holding 2 or more ids than the emptiest one up moves
        there (closed, created anew), so load spreads again after an outage. An
        id on a replica found down is dropped, and a reset that finds its replica
        unreachable is tried once more: neither costs an episode.
        """
        recycle = self.config.recycle_after
        if self.env_id is not None and recycle and self._episodes_on_id >= recycle:
            self._forget(close=True)
        elif self.env_id is not None and self.pool.crowded(self.server):
            self._forget(close=True)  # a replica back from an outage takes its share again
        self._done = True
        try:
            reply = self._call(lambda: self._reset(task_id), fresh_id=True)
        except ServerUnreachable:  # nothing was played yet: start on a replica that is up
            reply = self._call(lambda: self._reset(task_id), fresh_id=True)
        observation = self._checked(reply.observation or "")
        self._score = reply.score or 0.0
        self._actions = self._listed(reply, observation)
        if reply.task_group:
            self._groups[task_id] = reply.task_group
        self._episodes_on_id += 1
        self._done = False
        return observation

    def _reset(self, task_id: int) -> Reply:
        body = {self.dialect.id_key: self.env_id, **self.dialect.reset_fields(task_id)}
        reply = self.dialect.reset_reply(self._post("/reset", body))
        if reply.observation is None:  # WebShop: the page comes from GET /observation
            current = self._get_observation()
            reply = Reply(current, score=reply.score, actions=reply.actions)
        return reply

    def step(self, action: str) -> StepResult:
        """Send the parsed action; a rejected parse is answered locally, as AgentGym's client."""
        if self._done:
            raise RemoteEnvError("step() before reset() or after the episode ended")
        parse = self.dialect.parse_action if self.config.action_format == "agentgym" else raw_action
        try:
            sent = parse(action)
        except ActionRejected as rejected:
            return StepResult(rejected.observation, 0.0, False, info={"success": False})
        body = {self.dialect.id_key: self.env_id, "action": sent}
        reply = self._call(lambda: self.dialect.step_reply(self._post("/step", body)))
        observation = self._checked(reply.observation or "")
        reward = reply.reward
        if self.dialect.score_scale and reply.score is not None:
            reward = (reply.score - self._score) / self.dialect.score_scale
            self._score = reply.score
        done = reply.done or reply.truncated
        self._done = done
        self._actions = None if done else self._listed(reply, observation)
        info = {**reply.info, "action": sent, "success": self._success(reply, reward, done)}
        return StepResult(observation, float(reward), reply.done, reply.truncated, info)

    def _success(self, reply: Reply, reward: float, done: bool) -> bool:
        if isinstance(reply.info.get("success"), bool):
            return reply.info["success"]
        if not done:
            return False
        if self.dialect.score_scale:
            return self._score >= self.dialect.score_scale
        return reward > self.dialect.success_reward

    def _listed(self, reply: Reply, observation: str) -> list[str] | None:
        return reply.actions or listed_actions(observation)

    def _checked(self, observation: str) -> str:
        if observation.strip() == TIMEOUT_OBSERVATION:
            self._forget(close=True)
            raise RemoteEnvError(
                f"{self.server} answered the observation {TIMEOUT_OBSERVATION!r} "
                "(the page or task did not load); the env id will be recreated"
            )
        return observation

    # -- the env id and its faults ------------------------------------------------------

    def _call(self, fn: Any, *, fresh_id: bool = False) -> Any:
        """Run one protocol exchange; on any fault forget the env id, then re-raise."""
        if fresh_id:
            self._ensure_id()
        elif self.env_id is None or self._stale():
            self._forget(close=False)
            raise SessionLost(f"{self.server}: the server restarted; the episode is lost")
        try:
            return fn()
        except (RemoteEnvError, ProtocolError) as error:
            self._forget(close=not isinstance(error, SessionLost))
            if isinstance(error, ProtocolError):
                raise RemoteEnvError(str(error)) from error
            raise

    def _stale(self) -> bool:
        return self.server is not None and self.pool.generation(self.server) != self._generation

    def _ensure_id(self) -> None:
        if self.env_id is not None and self._stale():
            self._forget(close=False)  # the id may belong to someone else on the new server
        elif self.env_id is not None and not self.pool.is_up(self.server):
            self._forget(close=False)  # if it only lost a connection, its idle reaper closes it
        if self.env_id is not None:
            return
        server = self.pool.pick()
        body = self.dialect.create_body
        floor = self.pool.id_floor(server)
        reply, instance = self.pool.exchange(server, "POST", "/create", json=body)
        try:
            env_id = self.dialect.env_id(reply)
        except ProtocolError as error:
            raise RemoteEnvError(str(error)) from error
        grow = self.dialect.ids_only_grow
        self._generation = self.pool.opened(server, env_id, ids_only_grow=grow, floor=floor)
        self.server, self.env_id, self._instance = server, env_id, instance
        self._episodes_on_id = 0

    def _forget(self, *, close: bool) -> None:
        """Drop the env id; with `close`, tell the server (best effort, short timeout)."""
        if self.env_id is None or self.server is None:
            self.env_id = None
            return
        server, env_id = self.server, self.env_id
        self.env_id, self._done = None, True
        self.pool.released(server, env_id, self._generation)
        if close:
            with contextlib.suppress(RemoteEnvError):
                self.pool.request(
                    server,
                    "POST",
                    "/close",
                    json={self.dialect.id_key: env_id},
                    timeout_s=CLOSE_TIMEOUT_S,
                    instance=self._instance,
                )

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        assert self.server is not None
        return self.pool.request(self.server, "POST", path, json=body, instance=self._instance)

    def _get_observation(self) -> str:
        assert self.server is not None
        params = {self.dialect.id_key: self.env_id}
        reply = self.pool.request(
            self.server, "GET", "/observation", params=params, instance=self._instance
        )
        if isinstance(reply, dict) and isinstance(reply.get("observation"), str):
            return reply["observation"]
        if isinstance(reply, str):
            return reply
        raise ProtocolError(f"GET {self.server}/observation: no observation in {reply!r}")

    def close(self) -> None:
        """Close the env id on its server and let go of the shared connections (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._forget(close=True)
        release_pool(self._pool_key)
