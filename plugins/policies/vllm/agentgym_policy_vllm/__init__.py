"""vLLM generation for agentgym: continuous batching, constrained actions, in-place weight sync."""

from agentgym_core.api import lazy_exports
from agentgym_policy_vllm.config import VLLMPolicyConfig

__all__ = ["VLLMPolicy", "VLLMPolicyConfig"]
__getattr__ = lazy_exports(__name__, {"VLLMPolicy": "agentgym_policy_vllm.policy"})
