"""Names a module lends without importing them: each is imported from its home on first use.

A plugin package whose classes need torch still loads in a blink when the
plugin host imports it (to validate a config, in an env server process):
`__getattr__ = lazy_exports(__name__, {"GRPO": "agentgym_algo_grpo.loss"})`.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(module: str, homes: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` (PEP 562) importing each name of `homes` from its home module.

    `homes` maps a name to the module that defines it; the first access imports
    that module and keeps the value in `module`, so later ones cost nothing.
    """

    def __getattr__(name: str) -> Any:
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        setattr(sys.modules[module], name, value)
        return value

    return __getattr__
