"""A memory cgroup per sandbox, where the machine lets this process make one.

RLIMIT_AS bounds each process of a sandbox, so a sandbox of N processes could
hold N times `memory_mib`. A cgroup bounds them together. This process makes
one under its own cgroup (v2 where the memory controller is delegated to its
children, else v1's memory hierarchy), moves the sandbox's first process into
it before that process runs anything, and removes it afterwards. Where no
cgroup can be made (no write access: an unprivileged user, a container), the
sandbox lowers its process count instead (`sandbox.py`, docs/sandbox.md).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from pathlib import Path

CGROUPS = Path("/sys/fs/cgroup")
"""Where the kernel mounts cgroups."""


class MemoryCgroup:
    """One sandbox's memory cgroup: made, joined by a process, and removed."""

    def __init__(self, folder: Path, limit_file: str) -> None:
        self.folder = folder
        self._limit_file = limit_file

    @classmethod
    def make(cls, limit_bytes: int) -> MemoryCgroup | None:
        """A new cgroup holding at most `limit_bytes` of memory; None where none can be made."""
        found = _parent()
        if found is None:
            return None
        parent, limit_file = found
        folder = parent / f"agentgym-sandbox-{secrets.token_hex(6)}"
        try:
            folder.mkdir()
            (folder / limit_file).write_text(str(limit_bytes))
        except OSError:
            with contextlib.suppress(OSError):
                folder.rmdir()
            return None
        return cls(folder, limit_file)

    def join(self, pid: int) -> None:
        """Move process `pid` (and so everything it starts later) into this cgroup."""
        (self.folder / "cgroup.procs").write_text(str(pid))

    def remove(self, wait_s: float = 30.0) -> None:
        """Remove the cgroup once its processes are gone (in a thread: the last may be exiting)."""

        def remove() -> None:
            deadline = time.monotonic() + wait_s
            while True:
                try:
                    self.folder.rmdir()
                    return
                except FileNotFoundError:
                    return
                except OSError:  # busy: a process of the sandbox has not exited yet
                    if time.monotonic() > deadline:
                        return
                    time.sleep(0.05)

        with contextlib.suppress(OSError):
            self.folder.rmdir()
            return
        threading.Thread(target=remove, daemon=True, name="sandbox-cgroup").start()


def _parent() -> tuple[Path, str] | None:
    """The cgroup to make sandboxes' cgroups in, and the name of its memory limit file."""
    own = _own_cgroups()
    if "" in own:  # cgroup v2: the memory controller must be delegated to our children
        folder = CGROUPS / own[""].lstrip("/")
        with contextlib.suppress(OSError):
            if "memory" in (folder / "cgroup.subtree_control").read_text().split() and os.access(
                folder, os.W_OK
            ):
                return folder, "memory.max"
    if "memory" in own:  # cgroup v1's memory hierarchy
        folder = CGROUPS / "memory" / own["memory"].lstrip("/")
        if (folder / "memory.limit_in_bytes").exists() and os.access(folder, os.W_OK):
            return folder, "memory.limit_in_bytes"
    return None


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup per controller ("" for v2's unified one), from /proc/self/cgroup."""
    own: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(",") if controllers else [""]:
                own[controller] = path
    return own


def available() -> bool:
    """Whether sandboxes here get a memory cgroup each."""
    probe = MemoryCgroup.make(64 * 2**20)
    if probe is None:
        return False
    probe.remove()
    return True
