"""How much of the machine's CPU time other processes took while a run ran (Linux).

A kept run's wall time is an idle-machine figure only if nothing else ran. The
report finds kept runs that overlapped each other (`report.overlapping`), but
not a test suite, a probe or a benchmark run beside one; those used to be marked
by hand. `CpuShare` measures it instead: the machine's busy time over the run
(`/proc/stat`) less the run's own (this process, its finished children, and its
live descendants, such as env servers), as a share of the run's CPU capacity.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

SHARED_ABOVE = 0.10
"""Others' share above which a run counts as having shared the machine (kernel threads
and the shell take about 1% on an idle machine)."""


def machine_busy_seconds(stat: str | None = None) -> float | None:
    """CPU-seconds every CPU of the machine has been busy since boot; None off Linux."""
    try:
        text = stat if stat is not None else Path("/proc/stat").read_text()
    except OSError:
        return None
    fields = [int(x) for x in text.splitlines()[0].split()[1:9]]  # user .. steal
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def own_seconds() -> float:
    """CPU-seconds of this process, its waited-for children and its live descendants."""
    times = os.times()
    return (
        times.user + times.system + times.children_user + times.children_system
    ) + _live_descendants_seconds(os.getpid())


def _live_descendants_seconds(root: int) -> float:
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces
        parents[int(entry.name)] = int(fields[1])
        ticks[int(entry.name)] = int(fields[11]) + int(fields[12])  # utime, stime
    total = 0
    for pid in ticks:
        ancestor = parents.get(pid)
        while ancestor not in (None, 0, 1, root):
            ancestor = parents.get(ancestor)
        if ancestor == root and pid != root:
            total += ticks[pid]
    return total / os.sysconf("SC_CLK_TCK")


def others_share(busy: float, own: float, wall: float, cpus: int) -> float:
    """Others' CPU-seconds over the run's capacity (`wall` seconds on `cpus` CPUs), 0..1."""
    if wall <= 0:
        return 0.0
    return min(1.0, max(0.0, busy - own) / (wall * cpus))


class CpuShare:
    """Started when a run starts; `others()` when it ends."""

    def __init__(self) -> None:
        self._busy = machine_busy_seconds()
        self._own = own_seconds()
        self._start = time.monotonic()

    def others(self) -> float | None:
        """Others' share of the machine since the start (None where it cannot be read)."""
        busy = machine_busy_seconds()
        if busy is None or self._busy is None:
            return None
        share = others_share(
            busy - self._busy,
            own_seconds() - self._own,
            time.monotonic() - self._start,
            os.cpu_count() or 1,
        )
        return round(share, 3)
