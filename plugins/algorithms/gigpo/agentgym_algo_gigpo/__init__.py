"""GiGPO for agentgym: episode-level plus anchor-state step-level group advantages.

The algorithm (and torch) loads on first use, not when the plugin loads.
"""

from agentgym_algo_gigpo.config import GiGPOConfig
from agentgym_core.api import hookimpl, lazy_exports, turn_spans

__all__ = [
    "GiGPO",
    "GiGPOConfig",
    "anchor_states",
    "discounted_returns",
    "episode_advantages",
    "step_advantages",
    "turn_spans",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "GiGPO": "agentgym_algo_gigpo.loss",
        "anchor_states": "agentgym_algo_gigpo.loss",
        "discounted_returns": "agentgym_algo_gigpo.loss",
        "episode_advantages": "agentgym_algo_gigpo.loss",
        "step_advantages": "agentgym_algo_gigpo.loss",
    },
)


@hookimpl
def agentgym_register_algorithms(register):
    """Register `gigpo`."""
    register("gigpo", "agentgym_algo_gigpo.loss:GiGPO", config=GiGPOConfig)
