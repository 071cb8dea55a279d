"""A stopped run cleans up: SIGTERM ends it like Ctrl-C, through every `finally`.

Python's default for SIGTERM kills the process on the spot, so no `finally`
runs: environments are not closed, and what they started (Chromium for
webnav, a JVM per ScienceWorld worker) keeps running. Job schedulers, `kill`
and `timeout` all send SIGTERM.
"""

from __future__ import annotations

import signal
import sys
import threading

EXIT_TERMINATED = 128 + signal.SIGTERM
"""The exit status of a run stopped by SIGTERM, as a shell reports a killed process."""


def exit_cleanly_on_sigterm() -> None:
    """Make SIGTERM raise SystemExit(143) in the main thread (a no-op elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(signum: int, frame: object) -> None:
        sys.exit(EXIT_TERMINATED)

    signal.signal(signal.SIGTERM, stop)
