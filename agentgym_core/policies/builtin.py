"""The core's own plugin: registers the `hf` policy."""

from __future__ import annotations

from agentgym_core import hookimpl


@hookimpl
def agentgym_register_policies(register):
    """Register the transformers policy as `hf` (transformers loads when a run builds it)."""
    from agentgym_core.policies.hf_config import HFPolicyConfig

    register("hf", "agentgym_core.policies.hf:HFPolicy", config=HFPolicyConfig)
