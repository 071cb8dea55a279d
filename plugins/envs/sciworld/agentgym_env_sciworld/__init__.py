"""ScienceWorld as a text environment: its 30 task types, their variations and 0-100 score."""

from agentgym_env_sciworld.config import SciWorldConfig
from agentgym_env_sciworld.env import SciWorldEnv

__all__ = ["SciWorldConfig", "SciWorldEnv"]
