"""PPO for agentgym: GAE over the agent's tokens, clipped policy and value losses.

The algorithm (and torch) loads on first use, not when the plugin loads.
"""

from agentgym_algo_ppo.config import PPOConfig
from agentgym_core.api import hookimpl, lazy_exports

__all__ = [
    "PPO",
    "PPOConfig",
]
__getattr__ = lazy_exports(__name__, {"PPO": "agentgym_algo_ppo.loss"})


@hookimpl
def agentgym_register_algorithms(register):
    """Register `ppo`."""
    register("ppo", "agentgym_algo_ppo.loss:PPO", config=PPOConfig)
