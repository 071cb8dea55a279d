"""Existing AgentGym environment servers (BabyAI, TextCraft, WebShop, WebArena, ...) over HTTP."""

from agentgym_env_remote.client import (
    RemoteEnvError,
    ServerPool,
    ServerRestarted,
    ServerUnreachable,
    SessionLost,
)
from agentgym_env_remote.config import RemoteConfig
from agentgym_env_remote.env import RemoteEnv

__all__ = [
    "RemoteConfig",
    "RemoteEnv",
    "RemoteEnvError",
    "ServerPool",
    "ServerRestarted",
    "ServerUnreachable",
    "SessionLost",
]
