"""Entry point of the `vllm` policy (registered with or without vLLM installed)."""

from agentgym_core.api import hookimpl


@hookimpl
def agentgym_register_policies(register):
    """Register `vllm` and `vllm_server`; building `vllm` without vLLM says how to install it."""
    from agentgym_policy_vllm.config import VLLMPolicyConfig, VLLMServerPolicyConfig

    # the policies (and torch) load when a run builds one, not with the plugin
    register("vllm", "agentgym_policy_vllm.policy:VLLMPolicy", config=VLLMPolicyConfig)
    register(
        "vllm_server", "agentgym_policy_vllm.server:VLLMServerPolicy", config=VLLMServerPolicyConfig
    )


@hookimpl
def agentgym_add_commands(subparsers):
    """`agentgym serve-policy`: start the replicas the `vllm_server` policy generates on."""
    from agentgym_policy_vllm.command import add_parser

    add_parser(subparsers)
