"""REINFORCE++ for agentgym: KL-penalized token returns, normalized over the global batch.

The algorithm (and torch) loads on first use, not when the plugin loads.
"""

from agentgym_algo_reinforce_pp.config import ReinforcePPConfig
from agentgym_core.api import hookimpl, lazy_exports

__all__ = [
    "ReinforcePP",
    "ReinforcePPConfig",
]
__getattr__ = lazy_exports(__name__, {"ReinforcePP": "agentgym_algo_reinforce_pp.loss"})


@hookimpl
def agentgym_register_algorithms(register):
    """Register `reinforce_pp`."""
    register(
        "reinforce_pp", "agentgym_algo_reinforce_pp.loss:ReinforcePP", config=ReinforcePPConfig
    )
