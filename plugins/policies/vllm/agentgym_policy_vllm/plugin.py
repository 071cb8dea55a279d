"""Entry point of the `vllm` policy (registered with or without vLLM installed)."""

from agentgym_core.api import hookimpl


@hookimpl
def agentgym_register_policies(register):
    """Register `vllm` and `vllm_server`; building `vllm` without vLLM says how to install it."""
    from agentgym_policy_vllm.config import VLLMPolicyConfig, VLLMServerPolicyConfig
    from agentgym_policy_vllm.policy import VLLMPolicy
    from agentgym_policy_vllm.server import VLLMServerPolicy

    register("vllm", VLLMPolicy, config=VLLMPolicyConfig)
    register("vllm_server", VLLMServerPolicy, config=VLLMServerPolicyConfig)
