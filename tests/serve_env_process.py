"""`agentgym serve-env babyai` as a separate process that tests kill and restart."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import httpx


class EnvServer:
    """`agentgym serve-env babyai` in its own process, on one loopback port across restarts."""

    def __init__(self, levels: str = "[GoToObj]") -> None:
        self.levels = levels
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        command = [sys.executable, "-m", "agentgym_core.cli", "serve-env", "babyai"]
        command += ["--port", str(self.port), "--env-option", f"levels={self.levels}"]
        self.process = subprocess.Popen(
            [*command, "--log-level", "warning"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 180  # importing torch on a busy 2-core machine is slow
        while True:
            try:
                httpx.get(f"{self.url}/info", timeout=1)
                break
            except httpx.TransportError:
                assert self.process.poll() is None, "serve-env exited"
                assert time.monotonic() < deadline, "serve-env did not start"
                time.sleep(0.2)
        self.starts += 1

    def kill(self, restart_after_s: float | None = None) -> None:
        """SIGKILL (no goodbye to any client); optionally start again later, in a thread."""
        self.process.kill()
        self.process.wait(10)
        if restart_after_s is not None:
            threading.Timer(restart_after_s, self.start).start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
