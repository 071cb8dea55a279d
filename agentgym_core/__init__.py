"""agentgym: train LLM agents for long-horizon, multi-turn decision making with RL.

Plugins implement hooks marked with `hookimpl`; see `agentgym_core.hookspecs`.
"""

import pluggy

__version__ = "0.1.0"

PROJECT = "agentgym"
hookimpl = pluggy.HookimplMarker(PROJECT)
"""Marks plugin hook implementations, e.g. `@hookimpl def agentgym_register_environments(...)`."""

__all__ = ["PROJECT", "__version__", "hookimpl"]
