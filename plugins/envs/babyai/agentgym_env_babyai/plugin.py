"""Entry point of the `babyai` environment."""

from agentgym_core import hookimpl


@hookimpl
def agentgym_register_environments(register):
    """Register `babyai`."""
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    register("babyai", BabyAIEnv, config=BabyAIConfig)
