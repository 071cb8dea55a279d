"""The core's own plugin: registers the `hf` policy."""

from __future__ import annotations

from agentgym_core import hookimpl


@hookimpl
def agentgym_register_policies(register):
    """Register the transformers policy as `hf`."""
    from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig

    register("hf", HFPolicy, config=HFPolicyConfig)
