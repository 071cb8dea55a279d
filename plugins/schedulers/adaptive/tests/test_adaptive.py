"""The adaptive scheduler on synthetic histories, horizons worked out by hand."""

import logging
import random

import pytest
from agentgym_sched_adaptive import AdaptiveConfig, AdaptiveScheduler, Decision
from pydantic import ValidationError

from agentgym_core.interfaces import HorizonScheduler
from agentgym_core.plugins import PluginHost

KEY = "rollout/success_rate"
# window 2, patience 4: at one horizon, from its 4th update on, grow by 2 turns when the
# mean of the last 2 updates rose less than 0.1 over the mean of the 2 before them
BASE = {"min_turns": 2, "max_turns": 6, "window": 2, "patience": 4, "threshold": 0.1, "grow_by": 2}


def scheduler(**overrides) -> AdaptiveScheduler:
    return AdaptiveScheduler(AdaptiveConfig(**{**BASE, **overrides}))


def history(*success: float) -> list[dict[str, float]]:
    return [{KEY: s, "rollout/reward_mean": s / 2} for s in success]


def each_step(s: AdaptiveScheduler, h: list[dict[str, float]]) -> list[int]:
    """The horizon of updates 0 .. len(h), each asked as the trainer asks it."""
    return [s.max_turns(step, h[:step]) for step in range(len(h) + 1)]


PLATEAUS = history(0.1, 0.2, 0.3, 0.4, 0.4, 0.42, 0.5, 0.6, 0.6, 0.6, 0.6, 0.6, 0.6)


def test_grows_at_each_plateau_up_to_max_turns() -> None:
    # at 2 turns (updates 0-5): after update 3, 0.35 - 0.15 = +0.2; after 4, 0.4 - 0.25 =
    # +0.15; after 5, 0.41 - 0.35 = +0.06 < 0.1 -> 4 turns from update 6.
    # at 4 turns (updates 6-9): after 9, 0.6 - 0.55 = +0.05 -> 6 turns from update 10.
    # at 6 = max_turns: stays.
    s = scheduler()
    assert isinstance(s, HorizonScheduler)
    assert each_step(s, PLATEAUS) == [2] * 6 + [4] * 4 + [6] * 4
    assert s.horizons(PLATEAUS) == each_step(s, PLATEAUS)


def test_decisions_with_reasons() -> None:
    decisions = scheduler().decisions(PLATEAUS)
    assert [(d.step, d.before, d.after) for d in decisions] == [(6, 2, 4), (10, 4, 6)]
    assert decisions[0].reason == (
        "plateau: mean rollout/success_rate over the last 2 updates 0.41, over the 2 before "
        "0.35 (rise +0.06 < 0.1) after 6 updates at 2 turns"
    )
    assert isinstance(decisions[0], Decision)


def test_no_growth_while_improving() -> None:
    rising = history(*(0.06 * i for i in range(16)))  # +0.12 per 2-update window
    assert each_step(scheduler(), rising) == [2] * 17


def test_no_growth_before_patience() -> None:
    flat = history(0.5, 0.5, 0.5)
    assert each_step(scheduler(), flat) == [2, 2, 2, 2]
    assert each_step(scheduler(), history(0.5, 0.5, 0.5, 0.5)) == [2, 2, 2, 2, 4]
    assert each_step(scheduler(patience=6), history(*[0.5] * 6)) == [2] * 6 + [4]


def test_shrinks_back_after_a_collapse_when_enabled() -> None:
    # 2 turns: flat 0.5 -> grows to 4 from update 4. At 4: 0.6, 0.6 (best mean 0.6), then
    # 0.2: mean 0.4 >= 0.5 x 0.6; then 0.2: mean 0.2 < 0.3 -> back to 2 from update 8.
    h = history(0.5, 0.5, 0.5, 0.5, 0.6, 0.6, 0.2, 0.2, 0.5)
    s = scheduler(shrink=True, collapse_fraction=0.5)
    assert each_step(s, h) == [2] * 4 + [4] * 4 + [2] * 2
    last = s.decisions(h)[-1]
    assert (last.step, last.before, last.after) == (8, 4, 2)
    assert last.reason.startswith("collapse: mean rollout/success_rate over the last 2 updates")
    # without shrink the same fall is no rise: a plateau, so it grows
    assert each_step(scheduler(), h) == [2] * 4 + [4] * 4 + [6] * 2


def test_bounds_are_respected() -> None:
    # start at min_turns: a collapse cannot shrink below it
    s = scheduler(shrink=True)
    assert each_step(s, history(0.8, 0.8, 0.0, 0.0)) == [2] * 4 + [4]
    # grow_by larger than the room left stops at max_turns
    assert each_step(scheduler(grow_by=3), history(*[0.5] * 8))[-1] == 6
    # a factor rounds up and adds at least one turn: 3 -> 5 (4.5) -> 7 (7.5 capped)
    big = AdaptiveScheduler(
        AdaptiveConfig(
            min_turns=3, max_turns=7, window=2, patience=4, threshold=0.1, grow_factor=1.5
        )
    )
    assert each_step(big, history(*[0.5] * 12)) == [3] * 4 + [5] * 4 + [7] * 5


def test_factor_shrinks_by_division_rounded_down() -> None:
    s = AdaptiveScheduler(
        AdaptiveConfig(
            min_turns=2,
            max_turns=7,
            start_turns=7,
            window=1,
            patience=2,
            grow_factor=1.5,
            shrink=True,
        )
    )
    # 7: best 0.9, then 0.1 < 0.45 -> floor(7 / 1.5) = 4; at 4: 0.9, 0.1 -> floor(2.67) = 2
    assert each_step(s, history(0.9, 0.1, 0.9, 0.1)) == [7, 7, 4, 4, 2]


def test_float_factor_is_not_rounded_up_by_float_error() -> None:
    s = AdaptiveScheduler(
        AdaptiveConfig(min_turns=10, max_turns=20, window=1, patience=2, grow_factor=1.1)
    )
    assert each_step(s, history(0.5, 0.5)) == [10, 10, 11]  # 10 * 1.1 = 11.000000000000002


def test_same_history_same_answer_in_any_call_order() -> None:
    s = scheduler(shrink=True)
    forward = each_step(s, PLATEAUS)
    steps = list(range(len(PLATEAUS) + 1))
    random.Random(0).shuffle(steps)
    shuffled = {step: s.max_turns(step, PLATEAUS[:step]) for step in steps}
    assert [shuffled[step] for step in range(len(PLATEAUS) + 1)] == forward
    assert each_step(scheduler(shrink=True), PLATEAUS) == forward  # a fresh instance too


def test_entries_after_step_are_ignored() -> None:
    s = scheduler()
    for step in range(len(PLATEAUS) + 1):
        assert s.max_turns(step, PLATEAUS) == s.max_turns(step, PLATEAUS[:step])
    assert s.max_turns(100, PLATEAUS) == 6  # fewer entries than step: all of them


def _run(s: AdaptiveScheduler, steps: int, history: list[dict[str, float]]) -> list[int]:
    """A trainer loop whose success depends on the horizon it was given (feedback)."""
    horizons = []
    for step in range(len(history), steps):
        horizon = s.max_turns(step, history)
        horizons.append(horizon)
        noise = ((step * 37) % 7) / 100
        success = min(1.0, 0.1 * horizon + noise)
        history.append({KEY: success, "rollout/horizon": float(horizon)})
    return horizons


@pytest.mark.parametrize("shrink", [False, True])
def test_a_resumed_run_gets_the_same_horizons(shrink: bool) -> None:
    straight_history: list[dict[str, float]] = []
    straight = _run(scheduler(shrink=shrink), 40, straight_history)
    assert len(set(straight)) > 1  # the run did change horizon
    for resume_at in (1, 5, 6, 17, 33):
        checkpointed = [dict(m) for m in straight_history[:resume_at]]
        resumed = _run(scheduler(shrink=shrink), 40, checkpointed)
        assert straight[:resume_at] + resumed == straight
        assert checkpointed == straight_history
    recorded = [int(m["rollout/horizon"]) for m in straight_history]
    assert scheduler(shrink=shrink).horizons(straight_history)[:-1] == recorded


def test_a_change_is_logged_when_it_takes_effect(caplog) -> None:
    s = scheduler()
    with caplog.at_level(logging.INFO, logger="agentgym_sched_adaptive"):
        s.max_turns(5, PLATEAUS[:5])
        assert not caplog.records
        s.max_turns(6, PLATEAUS[:6])
    assert [r.getMessage() for r in caplog.records] == [
        "adaptive: 2 -> 4 turns from update 6: " + s.decisions(PLATEAUS)[0].reason
    ]


def test_a_missing_metric_is_named() -> None:
    with pytest.raises(ValueError, match="update 1 has no 'rollout/success_rate'"):
        scheduler().max_turns(2, [{KEY: 0.1}, {"rollout/reward_mean": 0.0}])
    s = scheduler(metric="rollout/reward_mean")
    assert each_step(s, history(*[0.5] * 4)) == [2, 2, 2, 2, 4]  # reward 0.25, flat


def test_negative_step_is_an_error() -> None:
    with pytest.raises(ValueError, match="step"):
        scheduler().max_turns(-1, [])


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"min_turns": 7}, "must not exceed max_turns"),
        ({"start_turns": 9}, "within"),
        ({"min_turns": 3, "start_turns": 2}, "within"),
        ({"window": 3}, "at least 2 \\* window"),
        ({"window": 0}, "greater than 0"),
        ({"patience": 0}, "greater than 0"),
        ({"grow_factor": 1.5}, "at most one"),
        ({"grow_by": 0}, "greater than 0"),
        ({"threshold": -0.1}, "greater than or equal to 0"),
        ({"collapse_fraction": 1.0}, "less than 1"),
        ({"max_turn": 5}, "max_turn"),
    ],
)
def test_validation_errors(config, message) -> None:
    with pytest.raises(ValidationError, match=message):
        AdaptiveConfig(**{**BASE, **config})


def test_grow_factor_must_grow() -> None:
    with pytest.raises(ValidationError, match="greater than 1"):
        AdaptiveConfig(max_turns=5, grow_factor=1.0)
    with pytest.raises(ValidationError, match="max_turns"):
        AdaptiveConfig()


def test_defaults() -> None:
    c = AdaptiveConfig(max_turns=20)
    assert (c.start, c.window, c.patience, c.grow_by, c.shrink) == (1, 5, 10, 1, False)


def test_every_field_documented() -> None:
    assert all(field.description for field in AdaptiveConfig.model_fields.values())


def test_registers_through_the_hook() -> None:
    import agentgym_sched_adaptive

    host = PluginHost({"adaptive-test": agentgym_sched_adaptive}, load_entry_points=False)
    registration = host.registry.get("scheduler", "adaptive")
    assert registration.config is AdaptiveConfig
    s = registration.factory(registration.config.model_validate(BASE))
    assert s.max_turns(10, PLATEAUS) == 6


def rewards(*values: float) -> list[dict[str, float]]:
    return [{"rollout/reward_mean": v} for v in values]


NEGATIVE = {"metric": "rollout/reward_mean", "shrink": True, "start_turns": 4}


def test_a_rise_of_a_negative_metric_is_no_collapse() -> None:
    # rewards in [-1, 1], floor -1: the moving average rises -0.6, -0.55, -0.45, so the best
    # is always the latest (height above the floor 0.4, 0.45, 0.55): no collapse. After update
    # 3 the rise -0.45 - (-0.6) = 0.15 >= 0.1: no plateau either. A ratio to 0 took
    # -0.6 < 0.5 x -0.6 = -0.3 for a collapse and shrank to 2 turns from update 2.
    s = scheduler(**NEGATIVE, metric_floor=-1.0)
    assert each_step(s, rewards(-0.6, -0.6, -0.5, -0.4)) == [4] * 5
    assert s.decisions(rewards(-0.6, -0.6, -0.5, -0.4)) == []


def test_a_fall_of_a_negative_metric_is_measured_from_its_floor() -> None:
    # best 0.2 after update 1 (1.2 above the floor -1); after 2 the mean -0.15 is 0.85 above,
    # not below 0.5 x 1.2 = 0.6; after 3 the mean -0.5 is 0.5 above: a collapse, 2 turns.
    h = rewards(0.2, 0.2, -0.5, -0.5)
    s = scheduler(**NEGATIVE, metric_floor=-1.0)
    assert each_step(s, h) == [4, 4, 4, 4, 2]
    assert s.decisions(h)[-1].reason == (
        "collapse: mean rollout/reward_mean over the last 2 updates -0.5 < "
        "-1 + 0.5 x (best 0.2 - -1) at 4 turns"
    )


def test_a_value_below_the_floor_is_an_error_with_shrink() -> None:
    with pytest.raises(ValueError, match="update 1 has rollout/reward_mean = -0.4, below "):
        scheduler(**NEGATIVE).max_turns(2, rewards(0.1, -0.4))
    assert scheduler(**{**NEGATIVE, "shrink": False}).max_turns(2, rewards(0.1, -0.4)) == 4


def test_metric_floor_zero_keeps_the_ratio_rule() -> None:
    # the collapse of test_shrinks_back_after_a_collapse_when_enabled, floor given explicitly
    h = history(0.5, 0.5, 0.5, 0.5, 0.6, 0.6, 0.2, 0.2, 0.5)
    explicit = scheduler(shrink=True, metric_floor=0.0).decisions(h)
    assert explicit == scheduler(shrink=True).decisions(h)
    assert explicit[-1].reason.endswith("< 0.5 x best 0.6 at 4 turns")
