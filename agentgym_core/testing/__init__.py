"""Test kit for plugin authors, in the spirit of tox's `tox.pytest` and Gymnasium's `check_env`.

`check_environment` checks an Environment plugin against the protocol; the
pytest fixtures (`agentgym_plugin`, `agentgym_host`, `tiny_model_dir`,
`agentgym_tiny_model`, `agentgym_train`) load automatically through the
`pytest11` entry point once agentgym-core is installed. In a plugin's own tests
they load only that plugin (the `agentgym` entry points of the nearest
`pyproject.toml`), the ones a test names with
`@pytest.mark.agentgym_plugins(...)`, and, for `agentgym_train`, the ones its
config names; so another installed plugin, broken or not, cannot fail them.

`agentgym_train` is the one way a plugin's test trains: it runs a tiny `train`
stage of any env, algorithm and scheduler from a config dict and returns a
`TrainRun` (metrics per update, checkpoint, each update's rollout batch), so a
test states the config it cares about and never touches the core's internals:

    CONFIG = {
        "env": {"name": "babyai", "levels": ["GoToObj"]},
        "algorithm": {"name": "grpo"},
        "scheduler": {"name": "fixed", "max_turns": 2},
    }

    def test_two_updates_then_a_third_after_a_resume(agentgym_train):
        run = agentgym_train(CONFIG, ["trainer.steps=2"])
        assert len(run.history) == 2 and list(run.batches) == [0, 1]
        resumed = agentgym_train(CONFIG, ["trainer.steps=3"], output_dir=run.output_dir)
        assert resumed.resumed_from == 2 and list(resumed.batches) == [2]
"""

from agentgym_core.testing.checks import CHECKS, EnvironmentCheckError, check_environment
from agentgym_core.testing.training import TrainRun

__all__ = ["CHECKS", "EnvironmentCheckError", "TrainRun", "check_environment"]
