"""Test kit for plugin authors: `check_environment` and pytest fixtures (see `pytest_plugin`)."""

from agentgym_core.testing.checks import EnvironmentCheckError, check_environment

__all__ = ["EnvironmentCheckError", "check_environment"]
