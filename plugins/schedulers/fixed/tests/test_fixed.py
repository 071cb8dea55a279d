import pytest
from agentgym_sched_fixed import FixedConfig, FixedScheduler
from pydantic import ValidationError

from agentgym_core.interfaces import HorizonScheduler
from agentgym_core.plugins import PluginHost


def test_constant_horizon() -> None:
    scheduler = FixedScheduler(FixedConfig(max_turns=7))
    assert isinstance(scheduler, HorizonScheduler)
    history = [{"success_rate": 0.1}, {"success_rate": 0.9}]
    assert {scheduler.max_turns(step, history[:step]) for step in range(500)} == {7}


@pytest.mark.parametrize("bad", [{"max_turns": 0}, {"max_turns": -3}, {}, {"max_turns": 5, "x": 1}])
def test_config_validation(bad) -> None:
    with pytest.raises(ValidationError):
        FixedConfig(**bad)


def test_every_field_documented() -> None:
    assert all(field.description for field in FixedConfig.model_fields.values())


def test_registers_through_the_hook() -> None:
    import agentgym_sched_fixed

    host = PluginHost({"fixed-test": agentgym_sched_fixed}, load_entry_points=False)
    registration = host.registry.get("scheduler", "fixed")
    assert registration.config is FixedConfig
    scheduler = registration.factory(registration.config(max_turns=3))
    assert scheduler.max_turns(0, []) == 3
