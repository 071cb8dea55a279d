"""Serve any installed environment over AgentGym's HTTP protocol (`agentgym serve-env`).

Needs the `serve` extra: `pip install 'agentgym-core[serve]'` (FastAPI, uvicorn).
Names load on first use, so the command line works (and starts fast) without it.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "create_app": "agentgym_core.serve.app",
    "DEFAULT_HOST": "agentgym_core.serve.runner",
    "ServerThread": "agentgym_core.serve.runner",
    "build_app": "agentgym_core.serve.runner",
    "serve": "agentgym_core.serve.runner",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
