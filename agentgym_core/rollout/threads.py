"""Environment calls on daemon threads: bounded, timed, and never waited for at exit.

Python cannot stop a thread, so an env call that never returns keeps its
thread for good. Those threads are daemons that nothing joins: a run that
ends (by success, error or signal) exits at once and says in one line which
calls it left behind. A call that times out gives up its slot, and a stuck
call never takes a worker from the others. An env error keeps the innermost
lines of its traceback (`error_trace`), bounded, for the trajectory.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any


class EnvCallTimeout(TimeoutError):
    """An environment call ran longer than `env_timeout_s`.

    `pending` is the still-running call; `stack` where it was when it timed
    out (formatted frames, innermost last), for the trajectory's `error_trace`.
    """

    def __init__(
        self, message: str, pending: concurrent.futures.Future, stack: list[str] | None = None
    ) -> None:
        super().__init__(message)
        self.pending = pending
        self.stack = stack or []


class DaemonThreads:
    """A minimal executor whose workers are daemon threads that nothing joins.

    `concurrent.futures.ThreadPoolExecutor` joins its workers when the
    interpreter exits, so a single env call that never returns would keep a
    finished run's process alive forever. Here the process exits without it:
    a call still running then is abandoned. A worker is started whenever no
    idle one is waiting, so a stuck call never takes a thread from the rest.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._work: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._lock = threading.Lock()
        self._workers = 0
        self._closed = False
        self._running: dict[concurrent.futures.Future, int] = {}
        """A running call -> the ident of its thread (where it hangs, if it does)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        """Run `fn(*args)` on a worker; its future."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("env threads are shut down")
            self._work.put((future, fn, args))
            if not self._idle.acquire(blocking=False):
                self._workers += 1
                name = f"{self._name}_{self._workers}"
                threading.Thread(target=self._worker, name=name, daemon=True).start()
        return future

    def _worker(self) -> None:
        while (item := self._work.get()) is not None:
            future, fn, args = item
            del item
            if future.set_running_or_notify_cancel():
                self._running[future] = threading.get_ident()
                try:
                    result = fn(*args)
                except BaseException as error:  # noqa: BLE001 - handed to the caller
                    future.set_exception(error)
                else:
                    future.set_result(result)
                finally:
                    self._running.pop(future, None)
            del future, fn, args  # an idle worker keeps no result or traceback alive
            self._idle.release()

    def stack(self, future: concurrent.futures.Future) -> list[str]:
        """Where a running call is now: its formatted frames, innermost last ([] when done)."""
        ident = self._running.get(future)
        frame = sys._current_frames().get(ident) if ident is not None else None
        if frame is None:
            return []
        frames = traceback.extract_stack(frame)
        ours = [i for i, f in enumerate(frames) if f.filename == __file__ and f.name == "_worker"]
        return traceback.format_list(frames[ours[-1] + 1 :] if ours else frames)

    def shutdown(self) -> None:
        """Cancel queued calls and let idle workers end; running calls are not waited for."""
        with self._lock:
            self._closed = True
            while True:
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
            for _ in range(self._workers):
                self._work.put(None)


class EnvThreads:
    """Runs environment calls in threads: at most `size` at once, each timed from when it starts.

    `size` 0 runs them inline, on the event loop (for fast in-process envs).

    Python cannot stop a thread, so a call that times out keeps its thread but
    gives up its slot, and the calls after it get other threads. The threads
    are daemons (`DaemonThreads`): a run that ends, by success, error or
    signal, exits at once even if a call never returns, and `shutdown` says so.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.seconds = 0.0
        self._threads = DaemonThreads("env")
        self._calls: dict[concurrent.futures.Future, str] = {}
        """Running calls -> their names (`Env.step`), until they return."""
        self._late: set[concurrent.futures.Future] = set()
        """The running calls that ran past their timeout."""
        self._slots: asyncio.Semaphore | None = None
        self._slots_loop: asyncio.AbstractEventLoop | None = None
        self._said = False

    @property
    def stuck(self) -> int:
        """Calls that ran past their timeout and are still running."""
        return sum(not future.done() for future in list(self._late))

    def _slots_for(self, loop: asyncio.AbstractEventLoop) -> asyncio.Semaphore:
        if self._slots is None or self._slots_loop is not loop:
            self._slots, self._slots_loop = asyncio.Semaphore(self.size), loop
        return self._slots

    async def call(self, timeout_s: float, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)` in a thread; raises EnvCallTimeout after `timeout_s` of running.

        With `size` 0 the call runs on the event loop itself: no thread hand-off
        (which costs more than a sub-millisecond in-process step), and no timeout.
        """
        if self.size == 0:
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.seconds += time.perf_counter() - start
        async with self._slots_for(asyncio.get_running_loop()):
            start = time.perf_counter()
            pending = self._threads.submit(fn, *args)
            name = str(getattr(fn, "__qualname__", fn))
            self._calls[pending] = name
            pending.add_done_callback(self._forget)
            try:
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the result
                # when it is cancelled just after the call returned, so a cancelled episode
                # would play on (and wait forever on a policy that has stopped)
                async with asyncio.timeout(timeout_s):
                    return await asyncio.shield(asyncio.wrap_future(pending))
            except TimeoutError as error:
                self._late.add(pending)
                if pending.done():  # it returned just now: nothing to forget later
                    self._late.discard(pending)
                raise EnvCallTimeout(
                    f"{name} took longer than {timeout_s} s",
                    pending,
                    stack=self._threads.stack(pending),
                ) from error
            finally:
                self.seconds += time.perf_counter() - start

    def _forget(self, done: concurrent.futures.Future) -> None:
        self._calls.pop(done, None)
        self._late.discard(done)

    def shutdown(self, grace_s: float = 0.0) -> None:
        """Stop accepting calls; queued ones are cancelled, running ones get `grace_s` to return.

        The grace lets a call that is merely slow (a browser starting) finish
        and leave nothing behind; calls already past their timeout are not
        waited for. Calls still running then are said in one line on stderr
        (once): the process will exit without them.
        """
        self._threads.shutdown()
        on_time = [f for f in list(self._calls) if not f.done() and f not in self._late]
        if grace_s > 0 and on_time:
            concurrent.futures.wait(on_time, timeout=grace_s)
        running = [
            (future, name) for future, name in list(self._calls.items()) if not future.done()
        ]
        if not running or self._said:
            return
        self._said = True
        late = sum(future in self._late for future, _ in running)
        count = f"{len(running)} env call{'s' if len(running) > 1 else ''} still running"
        if late:
            count += (
                " after env_timeout_s" if late == len(running) else f", {late} past env_timeout_s"
            )
        names = ", ".join(sorted({name for _, name in running}))
        it = "them" if len(running) > 1 else "it"
        print(f"agentgym: {count} ({names}); not waiting for {it}", file=sys.stderr, flush=True)


TRACE_LINES = 20
TRACE_CHARS = 4096
TRACE_LINE_CHARS = 500
"""Bounds of `Trajectory.error_trace`: the innermost lines are kept."""


def error_trace(error: BaseException) -> str:
    """The innermost lines of `error`'s traceback, its last line included, bounded (TRACE_*).

    For a call that timed out: where the call still hangs, not the traceback
    of the timeout (which only shows the engine waiting).
    """
    if isinstance(error, EnvCallTimeout) and error.stack:
        head = [f"{error} and still runs, here:"]
        lines = "".join(error.stack).splitlines()
    else:
        head, lines = [], "".join(traceback.format_exception(error)).splitlines()
    lines = [line[:TRACE_LINE_CHARS] for line in lines]
    kept = lines[-(TRACE_LINES - len(head)) :]
    while len(kept) > 1 and sum(len(line) + 1 for line in [*head, *kept]) > TRACE_CHARS:
        kept = kept[1:]
    if len(kept) < len(lines):
        head.append(f"... ({len(lines) - len(kept)} earlier lines left out)")
    return "\n".join([*head, *kept])


def timed_call(fn: Callable[..., Any], *args: Any, timeout_s: float) -> Any:
    """`fn(*args)` on a daemon thread, for code that calls an env outside the rollout engine.

    Raises `EnvCallTimeout` after `timeout_s` of running; the call is left
    behind on its daemon thread, so the process can still exit.
    """
    future: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            future.set_exception(error)

    thread = threading.Thread(target=run, daemon=True, name="env-call")
    thread.start()
    try:
        return future.result(timeout_s)
    except concurrent.futures.TimeoutError:
        name = getattr(fn, "__qualname__", fn)
        raise EnvCallTimeout(f"{name} took longer than {timeout_s} s", future) from None
