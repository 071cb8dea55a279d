import pytest
from agentgym_sched_scaling_inter import (
    PRESETS,
    ScalingInterConfig,
    ScalingInterScheduler,
    Stage,
)
from pydantic import ValidationError

from agentgym_core.interfaces import HorizonScheduler
from agentgym_core.plugins import PluginHost

BABYAI = [
    {"until_step": 100, "max_turns": 6},
    {"until_step": 200, "max_turns": 13},
    {"until_step": 300, "max_turns": 20},
]


def scheduler(**config) -> ScalingInterScheduler:
    return ScalingInterScheduler(ScalingInterConfig(**config))


def test_babyai_boundaries() -> None:
    s = scheduler(stages=BABYAI)
    assert isinstance(s, HorizonScheduler)
    expected = {0: 6, 99: 6, 100: 13, 199: 13, 200: 20, 299: 20, 300: 20, 10_000: 20}
    assert {step: s.max_turns(step, []) for step in expected} == expected


def test_single_stage_is_constant() -> None:
    s = scheduler(stages=[{"until_step": 1, "max_turns": 4}])
    assert [s.max_turns(step, []) for step in (0, 1, 50)] == [4, 4, 4]


@pytest.mark.parametrize(
    ("preset", "turns", "length"),
    [
        ("babyai", (6, 13, 20), 100),
        ("sciworld", (10, 20, 30), 100),
        ("textcraft", (10, 20, 30), 100),
        ("search", (5, 8, 10), 100),
        ("web", (8, 12, 15), 80),
    ],
)
def test_presets(preset, turns, length) -> None:
    s = scheduler(preset=preset)
    for stage, horizon in enumerate(turns):
        assert s.max_turns(stage * length, []) == horizon
        assert s.max_turns((stage + 1) * length - 1, []) == horizon
    assert s.max_turns(len(turns) * length + 1000, []) == turns[-1]


def test_preset_equals_explicit_stages() -> None:
    explicit = scheduler(stages=BABYAI)
    preset = scheduler(preset="babyai")
    assert [explicit.max_turns(t, []) for t in range(400)] == [
        preset.max_turns(t, []) for t in range(400)
    ]
    assert set(PRESETS) == {"babyai", "sciworld", "textcraft", "search", "web"}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({}, "exactly one"),
        ({"stages": BABYAI, "preset": "babyai"}, "exactly one"),
        ({"stages": []}, "empty"),
        ({"stages": [{"until_step": 100, "max_turns": 6}] * 2}, "greater than"),
        ({"stages": [BABYAI[1], BABYAI[0]]}, "greater than"),
        ({"stages": [BABYAI[0], {"until_step": 200, "max_turns": 5}]}, "must not be smaller"),
        ({"stages": [{"until_step": 100, "max_turns": 0}]}, "greater than 0"),
        ({"stages": [{"until_step": 0, "max_turns": 3}]}, "greater than 0"),
        ({"stages": [{"until_step": 10, "turns": 3}]}, "max_turns"),
        ({"preset": "alfworld"}, "preset"),
    ],
)
def test_validation_errors(config, message) -> None:
    with pytest.raises(ValidationError, match=message):
        ScalingInterConfig(**config)


def test_negative_step_is_an_error() -> None:
    with pytest.raises(ValueError, match="step"):
        scheduler(preset="web").max_turns(-1, [])


def test_resume_gives_identical_horizons() -> None:
    # A run that trains steps 0..249 against one resumed from a checkpoint at
    # step 100 (a stage boundary) and another at 200: fresh instances, no state.
    steps = list(range(250))
    uninterrupted = scheduler(preset="babyai")
    history: list[dict[str, float]] = []
    reference = []
    for step in steps:
        reference.append(uninterrupted.max_turns(step, history))
        history.append({"success_rate": step / 250})
    for resume_at in (100, 200):
        resumed = scheduler(preset="babyai")
        horizons = reference[:resume_at] + [
            resumed.max_turns(step, history[:step]) for step in steps[resume_at:]
        ]
        assert horizons == reference
    assert reference[99:101] == [6, 13]


def test_every_field_documented() -> None:
    for model in (ScalingInterConfig, Stage):
        assert all(field.description for field in model.model_fields.values())


def test_registers_through_the_hook() -> None:
    import agentgym_sched_scaling_inter

    host = PluginHost({"scaling-test": agentgym_sched_scaling_inter}, load_entry_points=False)
    registration = host.registry.get("scheduler", "scaling_inter")
    assert registration.config is ScalingInterConfig
    s = registration.factory(registration.config.model_validate({"stages": BABYAI}))
    assert s.max_turns(100, []) == 13
