"""GRPO for agentgym: group-normalized outcome advantages with a clipped policy loss.

The algorithm (and torch) loads on first use, not when the plugin loads.
"""

from agentgym_algo_grpo.config import GRPOConfig
from agentgym_core.api import hookimpl, lazy_exports

__all__ = [
    "GRPO",
    "GRPOConfig",
]
__getattr__ = lazy_exports(__name__, {"GRPO": "agentgym_algo_grpo.loss"})


@hookimpl
def agentgym_register_algorithms(register):
    """Register `grpo`."""
    register("grpo", "agentgym_algo_grpo.loss:GRPO", config=GRPOConfig)
