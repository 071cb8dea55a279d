"""Test kit for plugin authors, in the spirit of tox's `tox.pytest` and Gymnasium's `check_env`.

`check_environment` checks an Environment plugin against the protocol; the
pytest fixtures (`agentgym_plugin`, `agentgym_host`, `tiny_model_dir`) load
automatically through the `pytest11` entry point once agentgym-core is installed.
"""

from agentgym_core.testing.checks import CHECKS, EnvironmentCheckError, check_environment

__all__ = ["CHECKS", "EnvironmentCheckError", "check_environment"]
