"""Evaluate any OpenAI-compatible chat endpoint (API models, served checkpoints) with agentgym."""

from agentgym_policy_openai.config import OpenAIPolicyConfig
from agentgym_policy_openai.policy import EndpointError, OpenAIPolicy

__all__ = ["EndpointError", "OpenAIPolicy", "OpenAIPolicyConfig"]
