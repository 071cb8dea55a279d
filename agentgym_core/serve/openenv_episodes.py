"""Episodes of an OpenEnv session: which task a reset starts, reset, step, and their errors.

`serve.openenv` routes messages here; everything that touches the
environment (in the session store's thread pool, bounded by its timeout,
checked by the Environment contract) is in this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agentgym_core.interfaces import Environment
from agentgym_core.serve.dialects import ContractViolation, checked
from agentgym_core.serve.openenv_models import (
    EpisodeState,
    ErrorCode,
    ResetOptions,
    TextAction,
    TextObservation,
    error_message,
)
from agentgym_core.serve.sessions import EnvCallTimeout, Session, SessionStore

SPLITS = ("train", "test")
log = logging.getLogger(__name__)


class OpenEnvError(Exception):
    """A request the server refuses or an env call that failed: a code, a message, a status."""

    def __init__(self, code: ErrorCode, message: str, status: int, **extra: Any) -> None:
        super().__init__(message)
        self.code, self.status, self.extra = code, status, extra

    @property
    def ends_session(self) -> bool:
        """After a timeout the env may still be running: the session cannot go on."""
        return self.status == 504

    def ws_message(self) -> dict[str, Any]:
        """The error as a `/ws` message."""
        return error_message(self.code, str(self), **self.extra)


@dataclass
class Episode:
    """A session's episode, as `state` reports it."""

    episode_id: str | None = None
    task_id: int | None = None
    task_group: str | None = None
    step_count: int = 0
    running: bool = False
    done: bool = False
    score: float = 0.0

    def state(self) -> EpisodeState:
        """The `state` reply."""
        return EpisodeState(
            episode_id=self.episode_id,
            step_count=self.step_count,
            task_id=self.task_id,
            task_group=self.task_group,
            done=self.done,
            score=self.score,
        )


class OpenEnvServer:
    """Episodes of one registered env over OpenEnv: task choice, reset, step, and their errors."""

    def __init__(self, env_name: str, store: SessionStore, idle_timeout_s: float) -> None:
        self.env_name = env_name
        self.store = store
        self.idle_timeout_s = idle_timeout_s
        self.sessions = 0
        """Open `/ws` sessions, counted from accept (before their env exists)."""
        self._tasks: dict[str, list[int]] = {}
        self._instruction: str | None = None
        self._probe: Environment | None = None
        self._probe_lock = asyncio.Lock()
        self._ignored_logged: set[str] = set()

    async def probe(self) -> Environment:
        """An environment of its own for `/metadata` and `/tasks`, made on first use.

        As `EnvServer.probe`: those routes never build an env per request.
        """
        async with self._probe_lock:
            if self._probe is None:
                try:
                    self._probe = await self.store.build()
                except Exception as error:  # noqa: BLE001 - the env's constructor failed
                    raise OpenEnvError(
                        ErrorCode.FACTORY_ERROR, f"creating {self.env_name}: {error}", 500
                    ) from error
            return self._probe

    async def close_probe(self) -> None:
        """Close the probe env (shutdown); one stuck in a call is left behind."""
        if self._probe is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):  # not wait_for: see SessionStore.call
                    await self.store.call(self._probe.close)

    async def task_ids(self, env: Environment, split: str) -> list[int]:
        """The task ids of `split` (asked of the env once, then remembered)."""
        if split not in SPLITS:
            raise OpenEnvError(
                ErrorCode.VALIDATION_ERROR, f"unknown split {split!r}; splits: train, test", 422
            )
        if split not in self._tasks:
            ids = await self._call(env, "tasks", env.tasks, split)
            self._tasks[split] = [int(t) for t in ids]
        return self._tasks[split]

    async def instruction(self, env: Environment) -> str:
        """The env's instruction prompt (OpenEnv's metadata `description`)."""
        if self._instruction is None:
            value = await self._call(env, "instruction", env.instruction)
            self._instruction = self._checked(env, "instruction", value)
        return self._instruction

    async def choose_task(self, env: Environment, options: ResetOptions) -> int:
        """The task a reset starts (see `ResetOptions`)."""
        if options.task_id is not None:
            if options.split is not None or options.index is not None:
                raise OpenEnvError(
                    ErrorCode.VALIDATION_ERROR,
                    "reset: give task_id, or split and index, not both",
                    422,
                )
            return options.task_id
        ids = await self.task_ids(env, options.split or "train")
        if not ids:
            raise OpenEnvError(
                ErrorCode.VALIDATION_ERROR, f"split {options.split!r} has no tasks", 422
            )
        if options.index is not None:
            if options.index >= len(ids):
                raise OpenEnvError(
                    ErrorCode.VALIDATION_ERROR,
                    f"reset: index {options.index} is out of range: split "
                    f"{options.split or 'train'!r} has {len(ids)} tasks (0..{len(ids) - 1})",
                    422,
                )
            return ids[options.index]
        return random.Random(options.seed).choice(ids)

    async def reset(
        self, session: Session, episode: Episode, options: ResetOptions
    ) -> TextObservation:
        """Start the episode `options` name; `episode` describes it afterwards."""
        env = session.env
        task_id = await self.choose_task(env, options)
        episode.running = episode.done = False
        try:
            observation = await self.store.call(env.reset, task_id)
        except (ValueError, KeyError, IndexError) as error:
            raise OpenEnvError(
                ErrorCode.VALIDATION_ERROR,
                f"{self.env_name} cannot reset task {task_id}: {type(error).__name__}: {error}",
                422,
            ) from error
        except Exception as error:  # noqa: BLE001 - reported to the client
            raise self._failure("reset", error) from error
        observation = self._checked(env, "reset", observation)
        actions = self._checked(
            env, "valid_actions", await self._call(env, "valid_actions", env.valid_actions)
        )
        group = self._checked(
            env, "task_group", await self._call(env, "task_group", env.task_group, task_id)
        )
        episode.episode_id = options.episode_id or uuid.uuid4().hex
        episode.task_id, episode.task_group = task_id, group
        episode.step_count, episode.score, episode.running = 0, 0.0, True
        ignored = self._ignore(options)
        return TextObservation(
            text=observation,
            available_actions=actions,
            task_id=task_id,
            task_group=group,
            metadata={"ignored_reset_keys": ignored} if ignored else {},
        )

    def _ignore(self, options: ResetOptions) -> list[str]:
        """Reset keys this server does not know: logged once each, and returned."""
        ignored = options.ignored_keys()
        new = [key for key in ignored if key not in self._ignored_logged]
        if new:
            self._ignored_logged.update(new)
            log.warning(
                "%s: reset ignores %s (keys it does not know; it takes task_id, split, index, "
                "seed and episode_id); said once per key",
                self.env_name,
                ", ".join(new),
            )
        return ignored

    async def health_problem(self) -> str | None:
        """Why no environment can be built now, or None.

        Healthy once one was built and the last build succeeded. Otherwise
        (nothing built yet, or the last session's env failed to build) it
        tries a build, so a server whose factory recovers turns healthy again.
        """
        if self._probe is not None and self.store.factory_error is None:
            return None
        try:
            if self._probe is None:
                await self.probe()
            else:
                async with self._probe_lock:
                    env = await self.store.build()
                with contextlib.suppress(Exception):
                    await self.store.call(env.close)
        except OpenEnvError as error:
            return str(error)
        except Exception as error:  # noqa: BLE001 - the env's constructor failed
            return f"creating {self.env_name}: {type(error).__name__}: {error}"
        return None

    async def step(self, session: Session, episode: Episode, action: TextAction) -> TextObservation:
        """One step of the running episode."""
        if not episode.running:
            said = "after the episode ended" if episode.done else "before reset"
            if episode.episode_id is None:  # this connection's session never reset
                said += (
                    " in this session (a client that reconnects after the server closed its "
                    f"idle session, --idle-timeout {self.idle_timeout_s:g} s, is in a new one)"
                )
            raise OpenEnvError(
                ErrorCode.EXECUTION_ERROR,
                f'step {said}: send {{"type": "reset"}} to start an episode',
                409,
            )
        env = session.env
        result = self._checked(env, "step", await self._call(env, "step", env.step, action.text))
        done = bool(result.done or result.truncated)
        actions = None
        if not done:
            actions = self._checked(
                env, "valid_actions", await self._call(env, "valid_actions", env.valid_actions)
            )
        reward = float(result.reward)
        episode.step_count += 1
        episode.score += reward
        episode.running, episode.done = not done, done
        metadata: dict[str, Any] = {"truncated": bool(result.truncated)}
        if done:
            metadata["success"] = bool(result.info.get("success", reward > 0))
        metadata["info"] = _jsonable(dict(result.info))
        return TextObservation(
            text=result.observation,
            available_actions=actions,
            task_id=episode.task_id,
            task_group=episode.task_group,
            done=done,
            reward=reward,
            metadata=metadata,
        )

    # -- env calls and their failures -------------------------------------------------------

    async def _call(self, env: Environment, method: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return await self.store.call(fn, *args)
        except Exception as error:  # noqa: BLE001 - reported to the client
            raise self._failure(method, error) from error

    def _failure(self, method: str, error: BaseException) -> OpenEnvError:
        if isinstance(error, EnvCallTimeout):
            return OpenEnvError(
                ErrorCode.EXECUTION_ERROR,
                f"environment {self.env_name}: {method}: {error}; the session is closed",
                504,
            )
        return OpenEnvError(
            ErrorCode.EXECUTION_ERROR,
            f"environment {self.env_name}: {method} raised {type(error).__name__}: {error}",
            500,
        )

    def _checked(self, env: Environment, method: str, value: Any) -> Any:
        try:
            return checked(self.env_name, env, method, value)
        except ContractViolation as violation:
            raise OpenEnvError(
                ErrorCode.EXECUTION_ERROR,
                str(violation),
                500,
                contract_violation=violation.body["contract_violation"],
            ) from violation


def _jsonable(value: Any) -> Any:
    """`value` if JSON can carry it, else its `repr` (an env's info may hold anything)."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        if isinstance(value, dict):
            return {str(k): _jsonable(v) for k, v in value.items()}
        return repr(value)
    return value
