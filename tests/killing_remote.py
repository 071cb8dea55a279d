"""A plugin: the `remote` env, except that one step SIGKILLs the env server, for good.

Loaded by `agentgym` subprocesses through a `.dist-info` folder that a test
writes beside this module (see `tests/test_partial_eval.py`), like any
installed plugin's entry point.
"""

from __future__ import annotations

import os
import signal

from agentgym_core.api import hookimpl


@hookimpl
def agentgym_register_environments(register):
    """Register `killing-remote`."""
    from agentgym_env_remote import RemoteConfig, RemoteEnv

    class KillingConfig(RemoteConfig):
        """`remote`'s options, and which server process dies at which step."""

        kill_pid: int
        """The `agentgym serve-env` process to kill."""
        kill_at: int
        """The step (counted over every instance of this process) that kills it."""

    class KillingRemote(RemoteEnv):
        """The `remote` env whose `kill_at`-th step kills the server first (SIGKILL)."""

        steps = 0

        def step(self, action):
            KillingRemote.steps += 1
            if KillingRemote.steps == self.config.kill_at:
                os.kill(self.config.kill_pid, signal.SIGKILL)
            return super().step(action)

    register("killing-remote", KillingRemote, config=KillingConfig)
