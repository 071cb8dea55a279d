"""DPO for agentgym: preference optimization on whole trajectories of the same task.

The algorithm (and torch) loads on first use, not when the plugin loads.
"""

from agentgym_algo_dpo.config import DPOConfig
from agentgym_core.api import hookimpl, lazy_exports

__all__ = [
    "DPO",
    "DPOConfig",
]
__getattr__ = lazy_exports(__name__, {"DPO": "agentgym_algo_dpo.loss"})


@hookimpl
def agentgym_register_algorithms(register):
    """Register `dpo`."""
    register("dpo", "agentgym_algo_dpo.loss:DPO", config=DPOConfig)
