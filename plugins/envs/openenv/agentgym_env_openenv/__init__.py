"""Any OpenEnv environment server as an agentgym Environment (multi-turn over `/ws`)."""

from agentgym_env_openenv.adapters import ActionAdapter, ObservationAdapter
from agentgym_env_openenv.config import OpenEnvConfig
from agentgym_env_openenv.connection import OpenEnvServerError
from agentgym_env_openenv.env import OpenEnvEnv

__all__ = [
    "ActionAdapter",
    "ObservationAdapter",
    "OpenEnvConfig",
    "OpenEnvEnv",
    "OpenEnvServerError",
]
