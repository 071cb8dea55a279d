"""A sweep that the kernel kills is started again, and resumes (`--restarts N`).

A real model's runs take hours, and on a small machine the kernel's
out-of-memory killer ends a process with SIGKILL: nothing in the process can
catch it. The harness already resumes (finished runs kept, finished stages
skipped, training from its last checkpoint), so the sweep runs as a child
process and is started again when it dies by SIGKILL. Any other ending is
final: an exception is a bug to read, not to repeat, and SIGTERM or Ctrl-C is
someone stopping it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence


def supervise(
    command: Sequence[str],
    restarts: int,
    *,
    pause_s: float = 30.0,
    say: Callable[[str], None] = print,
) -> int:
    """Run `command` until it ends other than by SIGKILL, at most `restarts` times more.

    Returns its last exit status (negative: the signal that ended it).
    """
    for attempt in range(restarts + 1):
        status = _run(command)
        if status != -signal.SIGKILL:
            return status
        if attempt < restarts:
            say(
                f"[results] the sweep was killed (SIGKILL: out of memory?); resuming in "
                f"{pause_s:.0f} s, restart {attempt + 1} of {restarts}"
            )
            time.sleep(pause_s)
    say(f"[results] killed {restarts + 1} times; not restarted again")
    return status


def _run(command: Sequence[str]) -> int:
    """The child's exit status; stopping this process stops it with SIGTERM (it closes its envs)."""
    child = subprocess.Popen(command)
    try:
        return child.wait()
    except BaseException:
        child.terminate()
        child.wait()
        raise


def child_command(argv: Sequence[str]) -> list[str]:
    """This interpreter running the sweep with `argv`, less `--restarts` and its value."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--restarts":
            skip = True
            continue
        if arg.startswith("--restarts="):
            continue
        kept.append(arg)
    return [sys.executable, *kept]
