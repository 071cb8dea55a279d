"""vLLM generation for agentgym: continuous batching, constrained actions, in-place weight sync."""

from agentgym_policy_vllm.config import VLLMPolicyConfig
from agentgym_policy_vllm.policy import VLLMPolicy

__all__ = ["VLLMPolicy", "VLLMPolicyConfig"]
