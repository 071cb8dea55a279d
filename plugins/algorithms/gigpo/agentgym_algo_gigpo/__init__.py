"""GiGPO for agentgym: episode-level plus anchor-state step-level group advantages."""

from agentgym_algo_gigpo.loss import (
    GiGPO,
    GiGPOConfig,
    anchor_states,
    discounted_returns,
    episode_advantages,
    step_advantages,
)
from agentgym_core.api import hookimpl, turn_spans

__all__ = [
    "GiGPO",
    "GiGPOConfig",
    "anchor_states",
    "discounted_returns",
    "episode_advantages",
    "step_advantages",
    "turn_spans",
]


@hookimpl
def agentgym_register_algorithms(register):
    """Register `gigpo`."""
    register("gigpo", GiGPO, config=GiGPOConfig)
