"""BabyAI as a text environment: our renderer, AgentGym's action vocabulary, minigrid's reward."""

from agentgym_env_babyai.config import BabyAIConfig
from agentgym_env_babyai.env import BabyAIEnv

__all__ = ["BabyAIConfig", "BabyAIEnv"]
