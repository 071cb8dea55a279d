"""Sessions of an env server: one environment instance per id, with its lock and idle clock.

Environment calls run in a thread pool, never on the event loop, so one slow
step does not hold back other sessions. Each session has its own asyncio lock:
two requests for the same id are served in order, requests for different ids
run side by side.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import itertools
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentgym_core.interfaces import Environment


class Phase(enum.StrEnum):
    """Where a session's episode stands."""

    CREATED = "created"
    """No reset yet: step and observation are refused."""
    RUNNING = "running"
    DONE = "done"
    """The episode ended: step is refused until the next reset (not by TextCraft's dialect)."""


SHUTDOWN_CLOSE_S = 2.0
"""On shutdown, how long closing the open sessions may take before they are left behind."""


class UnknownSession(KeyError):
    """No session has this id (closed, reaped when idle, or never created)."""


class EnvCallTimeout(TimeoutError):
    """An environment call ran past the server's `env_timeout_s`."""


@dataclass
class Session:
    """One client's environment instance and its episode state."""

    id: int
    env: Environment
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    busy: int = 0
    """Requests in flight: a busy session is never reaped."""
    phase: Phase = Phase.CREATED
    was_reset: bool = False
    """Some reset succeeded (BabyAI's server keeps an id never reset on `/close`)."""
    observation: str = ""
    reward: float = 0.0
    """Reward of the last step (0 after a reset)."""
    score: float = 0.0
    """Sum of the rewards of the current episode."""


class SessionStore:
    """Live sessions keyed by id, plus the thread pool their environments run in.

    Ids start at a random base so that a restarted server does not hand out
    the ids of its previous life: a client still holding one is told the id is
    unknown, not handed another client's episode.
    """

    def __init__(
        self,
        env_factory: Callable[[], Environment],
        *,
        threads: int = 8,
        max_sessions: int = 1024,
        env_timeout_s: float = 300.0,
    ) -> None:
        self.factory = env_factory
        self._sessions: dict[int, Session] = {}
        self._ids = itertools.count(secrets.randbelow(1 << 30))
        self.max_sessions = max_sessions
        self.env_timeout_s = env_timeout_s
        self.executor = concurrent.futures.ThreadPoolExecutor(threads, "agentgym-env")
        self.created = 0
        self.closed = 0
        self._running = 0
        self._running_lock = threading.Lock()
        self.factory_error: str | None = None
        """Why the last environment build failed; None after one succeeds (or before any)."""

    def __len__(self) -> int:
        return len(self._sessions)

    @property
    def running(self) -> int:
        """Environment calls whose thread has not returned (timed-out ones included)."""
        return self._running

    async def call(
        self,
        fn: Callable[..., Any],
        *args: Any,
        orphaned: Callable[[Any], None] | None = None,
    ) -> Any:
        """Run a blocking environment call in the pool, bounded by `env_timeout_s`.

        The clock starts when a thread takes the call up, not when it is queued:
        a busy pool does not fail calls that never ran. A call still queued when
        its caller stops waiting (cancelled) is dropped from the queue; one that
        already runs cannot be stopped, so `orphaned` is given its result if it
        returns after its caller gave up (to close an env built too late).
        """
        loop = asyncio.get_running_loop()
        started = loop.create_future()

        def run() -> Any:
            _settle_soon(loop, started)
            return fn(*args)

        job = self.executor.submit(run)
        with self._running_lock:
            self._running += 1
        job.add_done_callback(self._returned)  # when its thread returns, not when we stop waiting
        job.add_done_callback(lambda _: _settle_soon(loop, started))  # cancelled by a shutdown
        try:
            await started
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancel that
            # arrives as the call returns (see rollout/threads.py), and a request or a shutdown
            # that was cancelled would carry on
            async with asyncio.timeout(self.env_timeout_s):
                return await asyncio.wrap_future(job)
        except TimeoutError as error:
            _abandon(job, orphaned)
            name = getattr(fn, "__qualname__", repr(fn))
            raise EnvCallTimeout(f"{name} took longer than {self.env_timeout_s} s") from error
        except asyncio.CancelledError:
            _abandon(job, orphaned)
            raise

    def _returned(self, _: concurrent.futures.Future[Any]) -> None:
        with self._running_lock:
            self._running -= 1

    async def build(self) -> Environment:
        """A new environment from the factory (in the pool).

        One built after its caller gave up (a timeout, a client gone) is closed
        when its constructor returns, never leaked; one still queued is never
        built. `factory_error` says whether the last build failed, for `/health`.
        """
        try:
            env = await self.call(self.factory, orphaned=_close_quietly)
        except Exception as error:
            self.factory_error = f"{type(error).__name__}: {error}"
            raise
        self.factory_error = None
        return env

    async def create(self) -> Session:
        """Build a new environment (in the pool) and register it under a fresh id."""
        env = await self.build()
        session = Session(next(self._ids), env)
        self._sessions[session.id] = session
        self.created += 1
        return session

    def get(self, session_id: int) -> Session:
        """The session `session_id`; `UnknownSession` if there is none."""
        try:
            return self._sessions[session_id]
        except KeyError:
            raise UnknownSession(session_id) from None

    async def close(self, session_id: int) -> None:
        """Forget a session and close its environment (errors on close are swallowed)."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            raise UnknownSession(session_id)
        self.closed += 1
        with contextlib.suppress(Exception):  # the client is gone either way
            await self.call(session.env.close)

    async def reap(self, idle_timeout_s: float) -> list[int]:
        """Close sessions idle for longer than `idle_timeout_s`; returns their ids."""
        now = time.monotonic()
        stale = [
            s.id
            for s in self._sessions.values()
            if s.busy == 0 and now - s.last_used > idle_timeout_s
        ]
        for session_id in stale:
            with contextlib.suppress(UnknownSession):  # closed meanwhile by its client
                await self.close(session_id)
        return stale

    async def close_all(self, timeout_s: float = SHUTDOWN_CLOSE_S) -> None:
        """Close every session, waiting `timeout_s` at most, then the thread pool (shutdown).

        An env stuck in a call may never close: it is left behind, not waited for.
        """

        async def close(session_id: int) -> None:
            with contextlib.suppress(UnknownSession):  # closed meanwhile by its client
                await self.close(session_id)

        closing = [asyncio.ensure_future(close(sid)) for sid in list(self._sessions)]
        if closing:
            _, late = await asyncio.wait(closing, timeout=timeout_s)
            for task in late:
                task.cancel()
        self.executor.shutdown(wait=False, cancel_futures=True)


def _settle_soon(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any]) -> None:
    """Mark `future` done from a pool thread (a no-op once done, or once the loop is closed)."""

    def settle() -> None:
        if not future.done():
            future.set_result(None)

    with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
        loop.call_soon_threadsafe(settle)


def _abandon(job: concurrent.futures.Future[Any], orphaned: Callable[[Any], None] | None) -> None:
    """The caller stopped waiting for `job`: drop it if queued, else hand its late result on."""
    if job.cancel() or orphaned is None:
        return

    def hand_on(done: concurrent.futures.Future[Any]) -> None:
        if not done.cancelled() and done.exception() is None:
            orphaned(done.result())

    job.add_done_callback(hand_on)


def _close_quietly(env: Any) -> None:
    """Close an environment nobody will use (in the pool thread that built it)."""
    with contextlib.suppress(Exception):
        env.close()


@contextlib.asynccontextmanager
async def using(session: Session):
    """Hold a session's lock, mark it busy, and refresh its idle clock."""
    session.busy += 1
    try:
        async with session.lock:
            yield session
    finally:
        session.busy -= 1
        session.last_used = time.monotonic()
