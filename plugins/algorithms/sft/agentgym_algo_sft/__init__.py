"""SFT for agentgym: maximum likelihood of the agent's turns in AgentTraj or expert trajectories.

The algorithm (and torch) loads on first use, not when the plugin loads.
"""

from agentgym_algo_sft.config import ExpertData, RollIn, SFTConfig
from agentgym_core.api import hookimpl, lazy_exports

__all__ = [
    "ExpertData",
    "RollIn",
    "SFT",
    "SFTConfig",
]
__getattr__ = lazy_exports(__name__, {"SFT": "agentgym_algo_sft.loss"})


@hookimpl
def agentgym_register_algorithms(register):
    """Register `sft`."""
    register("sft", "agentgym_algo_sft.loss:SFT", config=SFTConfig)
