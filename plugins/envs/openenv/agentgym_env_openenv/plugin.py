"""Entry point of the `openenv` environment."""

from agentgym_core.api import hookimpl


@hookimpl
def agentgym_register_environments(register):
    """Register `openenv`."""
    from agentgym_env_openenv import OpenEnvConfig, OpenEnvEnv

    register("openenv", OpenEnvEnv, config=OpenEnvConfig)
