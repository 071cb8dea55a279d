"""The parent's handle on a worker process (see `worker`): start, call with a timeout, stop.

Every live worker is tracked, and an `atexit` hook stops the ones still
running when the interpreter exits, so a forgotten `close()` leaks no JVM.
A worker that dies, answers with an error or outlives `call_timeout_s` is
killed and the call raises `WorkerError`: the rollout engine records the
episode as `env_error` instead of scoring it.
"""

from __future__ import annotations

import atexit
import json
import socket
import subprocess
import sys
import threading
import weakref
from multiprocessing.connection import Connection
from typing import Any

CLOSE_GRACE_S = 10.0
"""How long a worker may take to stop its JVM after `close` before it is killed."""

_live: weakref.WeakSet[Worker] = weakref.WeakSet()


class WorkerError(RuntimeError):
    """The simulator's worker or JVM failed: an infrastructure fault, not the agent's."""


def java_hint(java: str) -> str:
    """What to do when the JVM does not start."""
    return (
        f"ScienceWorld needs a Java runtime (tried {java!r}); install one "
        "(plugins/envs/sciworld/scripts/ensure_java.sh) or set env.java to its path"
    )


class Worker:
    """One worker process with its JVM; thread-safe, one call at a time."""

    def __init__(self, java: str, jvm_options: list[str], call_timeout_s: float) -> None:
        self.java = java
        self.call_timeout_s = call_timeout_s
        self.closed = False
        self._lock = threading.Lock()
        parent, child = socket.socketpair()
        options = json.dumps({"java": java, "jvm_options": jvm_options})
        try:
            command = [sys.executable, "-m", "agentgym_env_sciworld.worker"]
            self.process = subprocess.Popen(
                [*command, str(child.fileno()), options],
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                # Own session: a Ctrl-C in the terminal reaches the parent, which stops us.
                start_new_session=True,
            )
        finally:
            child.close()
        self._conn = Connection(parent.detach())
        _live.add(self)
        try:
            ready = self._receive("start")
        except WorkerError as error:
            raise WorkerError(f"{error}; {java_hint(java)}") from error
        self.jvm_pid: int = ready["jvm_pid"]

    @property
    def pid(self) -> int:
        """Process id of the worker."""
        return self.process.pid

    def call(self, op: str, **kwargs: Any) -> Any:
        """Run `op` in the worker; raises WorkerError (and kills the worker) on any failure."""
        with self._lock:
            if self.closed:
                raise WorkerError(f"worker {self.pid} is closed; cannot run {op}")
            try:
                self._conn.send((op, kwargs))
            except OSError as error:
                self._kill()
                raise WorkerError(f"worker {self.pid} is gone ({error}) before {op}") from error
            return self._receive(op)

    def _receive(self, op: str) -> Any:
        try:
            ready = self._conn.poll(self.call_timeout_s)
            if not ready:
                self._kill()
                waited = self.call_timeout_s
                raise WorkerError(f"worker {self.pid}: no answer to {op} in {waited} s")
            status, value = self._conn.recv()
        except (EOFError, OSError) as error:
            code = self._kill()
            raise WorkerError(f"worker {self.pid} died during {op} (exit code {code})") from error
        if status != "ok":
            self._kill()
            raise WorkerError(f"worker {self.pid} failed in {op}: {value}")
        return value

    def close(self) -> None:
        """Ask the worker to stop its JVM and exit; kill it if it does not. Idempotent."""
        with self._lock:
            if self.closed:
                return
            try:
                self._conn.send(("close", {}))
                self._conn.poll(CLOSE_GRACE_S)
                self.process.wait(CLOSE_GRACE_S)
            except (OSError, subprocess.TimeoutExpired):
                pass  # killed below
            self._kill()

    def _kill(self) -> int | None:
        """Make sure the worker is gone; its JVM follows it (die-on-broken-pipe)."""
        self.closed = True
        if self.process.poll() is None:
            self.process.kill()
        code = self.process.wait()
        self._conn.close()
        _live.discard(self)
        return code


@atexit.register
def _close_all() -> None:
    for worker in list(_live):
        worker.close()
