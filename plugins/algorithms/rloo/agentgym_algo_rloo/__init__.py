"""RLOO for agentgym: leave-one-out baselines over each group with a clipped policy loss.

The algorithm (and torch) loads on first use, not when the plugin loads.
"""

from agentgym_algo_rloo.config import RLOOConfig
from agentgym_core.api import hookimpl, lazy_exports

__all__ = [
    "RLOO",
    "RLOOConfig",
]
__getattr__ = lazy_exports(__name__, {"RLOO": "agentgym_algo_rloo.loss"})


@hookimpl
def agentgym_register_algorithms(register):
    """Register `rloo`."""
    register("rloo", "agentgym_algo_rloo.loss:RLOO", config=RLOOConfig)
