"""The state behind `serve-env`'s routes: sessions, episodes, and how they fail.

Routes stay thin: each looks a session up and calls one method here, which
raises `EnvError` for anything the client did wrong or the env refused; the
app turns that into the reply of its mode (see `dialects`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Callable
from typing import Any

from agentgym_core.interfaces import Environment
from agentgym_core.serve.dialects import (
    ContractViolation,
    Dialect,
    bad_task,
    checked,
    env_failure,
    unknown_id,
    wrong_phase,
)
from agentgym_core.serve.instance import new_instance
from agentgym_core.serve.models import (
    DetailResponse,
    ObservationResponse,
    ResetResponse,
    StepResponse,
    finite,
    jsonable,
)
from agentgym_core.serve.sessions import (
    EnvCallTimeout,
    Phase,
    Session,
    SessionStore,
    UnknownSession,
    using,
)


class EnvServer:
    """Sessions, the reaper, a probe env for metadata, and the dialect answers follow."""

    def __init__(
        self, env_name: str, store: SessionStore, idle_timeout_s: float, dialect: Dialect
    ) -> None:
        self.env_name = env_name
        self.store = store
        self.idle_timeout_s = idle_timeout_s
        self.dialect = dialect
        self.instance = new_instance()
        """This life of the server (see `instance`): new at every start."""
        self._probe: Environment | None = None
        self._probe_lock = asyncio.Lock()
        self._task_ids: list[int] | None = None

    # -- lifetime ------------------------------------------------------------------------

    async def probe(self) -> Environment:
        """An environment instance of its own for `tasks` and `instruction`, made on first use."""
        async with self._probe_lock:
            if self._probe is None:
                self._probe = await self.store.build()
            return self._probe

    async def instruction(self) -> str:
        """The env's instruction prompt, checked to be a str."""
        env = await self.probe()
        return checked(self.env_name, env, "instruction", await self.store.call(env.instruction))

    async def reaper(self) -> None:
        """Close idle sessions, checking four times per idle timeout."""
        interval = max(min(self.idle_timeout_s / 4, 30.0), 0.05)
        while True:
            await asyncio.sleep(interval)
            await self.store.reap(self.idle_timeout_s)

    async def shutdown(self) -> None:
        """Close every session and the probe, leaving behind (and naming) envs stuck in a call."""
        if self._probe is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):  # not wait_for: see SessionStore.call
                    await self.store.call(self._probe.close)
        await self.store.close_all()
        if self.store.running:
            print(
                f"serve-env {self.env_name}: shutting down with {self.store.running} environment "
                "call(s) still running (an env that does not return); not waiting for them",
                file=sys.stderr,
                flush=True,
            )

    # -- lookups -------------------------------------------------------------------------

    def session(self, session_id: int, where: str = "body") -> Session:
        """The session, or an `EnvError` naming the `id` field (404 / "not valid")."""
        try:
            return self.store.get(session_id)
        except UnknownSession:
            raise unknown_id(session_id, where) from None

    def require_phase(self, session: Session, *allowed: Phase, where: str = "body") -> None:
        """Refuse (409 / AgentGym's words) when the episode's phase does not allow the call."""
        if session.phase not in allowed:
            raise wrong_phase(session, where)

    def observation(self, session: Session) -> ObservationResponse | str:
        """The last observation: a bare string where AgentGym's server answers one."""
        if self.dialect.bare_observation:
            return session.observation
        number = self.dialect.number
        return ObservationResponse(
            observation=session.observation,
            reward=number(session.reward),
            score=number(session.score),
            done=session.phase is Phase.DONE,
        )

    def detail(self, session: Session) -> DetailResponse:
        """TextCraft's `GET /detail`: the last reply's fields, and `deleted: false`."""
        return DetailResponse(
            observation=session.observation,
            done=session.phase is Phase.DONE,
            reward=self.dialect.number(session.reward),
        )

    # -- episodes ------------------------------------------------------------------------

    async def create(self) -> tuple[Session, str]:
        """A new session, and its first observation where the dialect resets on create."""
        try:
            session = await self.store.create()
        except Exception as error:  # noqa: BLE001 - the env's constructor failed
            env_failure(self.env_name, "creating an instance", error)
        if not self.dialect.resets_on_create:
            return session, ""
        try:
            async with using(session):
                reply = await self.reset(session, session.id)
        except BaseException:
            with contextlib.suppress(UnknownSession):  # a session nobody was told of
                await self.store.close(session.id)
            raise
        return session, reply.observation

    async def reset(self, session: Session, data_idx: int) -> ResetResponse:
        """Reset `session` to `data_idx`, wrapped into the env's tasks where the dialect wraps.

        AgentGym's TextCraft takes any index modulo its goal count (its create
        resets to `data_idx = id`); ours refuses ids out of range, and our
        session ids start at a random base. So an index that is not one of the
        env's task ids becomes `ids[data_idx % len(ids)]`: with TextCraft's
        default options, ids are 0..543 and that is AgentGym's own modulo.
        """
        if self.dialect.wraps_task_ids:
            ids = await self._all_task_ids(session)
            if ids and data_idx not in ids:
                data_idx = ids[data_idx % len(ids)]
        return await self.start_episode(session, data_idx)

    async def _all_task_ids(self, session: Session) -> list[int]:
        """Every task id of the env (both splits), sorted; the same for every session."""
        if self._task_ids is None:
            env = session.env
            train = await self._env_call(session, "tasks()", env.tasks, "train")
            test = await self._env_call(session, "tasks()", env.tasks, "test")
            self._task_ids = sorted({int(t) for t in [*train, *test]})
        return self._task_ids

    async def start_episode(self, session: Session, data_idx: int) -> ResetResponse:
        """Reset `session` to task `data_idx` (the caller holds its lock)."""
        env, store = session.env, self.store
        try:
            observation = await store.call(env.reset, data_idx)
            actions = await store.call(env.valid_actions)
            group = await store.call(env.task_group, data_idx)
        except (ValueError, KeyError, IndexError) as error:
            session.phase = Phase.CREATED
            raise bad_task(self.env_name, data_idx, error) from error
        except Exception as error:  # noqa: BLE001 - reported as a server error
            await self._failed(session, error)
            env_failure(self.env_name, f"reset({data_idx})", error)
        observation = self._checked(session, "reset", observation)
        actions = self._checked(session, "valid_actions", actions)
        group = self._checked(session, "task_group", group)
        session.phase, session.observation = Phase.RUNNING, observation
        session.score = session.reward = 0.0
        session.was_reset = True
        extra = {"deleted": False} if self.dialect.reset_says_deleted else {}
        return ResetResponse(
            id=session.id,
            observation=observation,
            reward=self.dialect.number(0.0),
            score=self.dialect.number(0.0),
            available_actions=actions,
            task_group=group,
            **extra,
        )

    async def play(self, session: Session, action: str) -> StepResponse:
        """One step of `session` (the caller holds its lock and checked the phase)."""
        result = await self._env_call(session, "step", session.env.step, action)
        result = self._checked(session, "step", result)
        done = bool(result.done or result.truncated)
        actions = None
        if not done:
            actions = await self._env_call(session, "step", session.env.valid_actions)
            actions = self._checked(session, "valid_actions", actions)
        reward = finite(float(result.reward))
        session.score += reward
        session.reward, session.observation = reward, result.observation
        session.phase = Phase.DONE if done else Phase.RUNNING
        return StepResponse(
            observation=result.observation,
            reward=self.dialect.number(reward),
            score=self.dialect.number(session.score),
            done=bool(result.done),
            truncated=bool(result.truncated),
            available_actions=actions,
            info=jsonable(dict(result.info)),
        )

    async def close(self, session_id: int) -> bool:
        """Close a session: `False` for an unknown id (AgentGym's), or 404 when strict.

        BabyAI's server answers `false` for an id created but never reset, and
        keeps it (a reset still works): so does its dialect.
        """
        try:
            if self.dialect.close_needs_reset and not self.store.get(session_id).was_reset:
                return False
            await self.store.close(session_id)
        except UnknownSession:
            if self.dialect.strict:
                raise unknown_id(session_id, "body") from None
            return False
        return True

    # -- env calls and their failures -------------------------------------------------------

    async def _env_call(
        self, session: Session, doing: str, fn: Callable[..., Any], *args: Any
    ) -> Any:
        """One env call of `session`; if it raises, the episode is over and the error reported."""
        try:
            return await self.store.call(fn, *args)
        except Exception as error:  # noqa: BLE001 - reported as a server error
            await self._failed(session, error)
            env_failure(self.env_name, doing, error)

    def _checked(self, session: Session, method: str, value: Any) -> Any:
        """`value` if it keeps the Environment contract, else a `ContractViolation` (500)."""
        try:
            return checked(self.env_name, session.env, method, value)
        except ContractViolation:
            session.phase = Phase.CREATED
            raise

    async def _failed(self, session: Session, error: BaseException) -> None:
        """The episode cannot go on; a timed-out env may still be running: never reuse it."""
        session.phase = Phase.CREATED
        if isinstance(error, EnvCallTimeout):
            with contextlib.suppress(UnknownSession):
                await self.store.close(session.id)
