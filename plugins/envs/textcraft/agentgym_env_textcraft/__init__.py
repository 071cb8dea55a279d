"""TextCraft: craft a Minecraft item from recipes given in text, with AgentGym's commands."""

from agentgym_env_textcraft.config import TextCraftConfig
from agentgym_env_textcraft.env import TextCraftEnv

__all__ = ["TextCraftConfig", "TextCraftEnv"]
