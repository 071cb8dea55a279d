"""check_environment passes a correct env and names the rule each broken fake breaks."""

from __future__ import annotations

import itertools
import random
import warnings

import pytest
from colour_env import ColourEnv

from agentgym_core.plugins import PluginHost
from agentgym_core.testing import CHECKS, EnvironmentCheckError, check_environment
from agentgym_core.types import StepResult

COLOURS = ("red", "green", "blue")


class GoodEnv:
    """Say the goal colour; deterministic, enumerable actions, ends on success."""

    def __init__(self):
        self.goal, self.done, self.closed = None, False, 0

    def tasks(self, split):
        return list(range(10)) if split == "train" else list(range(10, 15))

    def instruction(self):
        return "Say the colour of the goal: `say <colour>`."

    def reset(self, task_id):
        self.goal, self.done = COLOURS[task_id % 3], False
        return f"Goal: say {self.goal}."

    def step(self, action):
        if self.done:
            return StepResult("The episode is over.", 0.0, True)
        if action == f"say {self.goal}":
            self.done = True
            return StepResult("Correct.", 1.0, True, info={"success": True})
        if action in self.valid_actions():
            return StepResult("Wrong colour.", 0.0, False)
        return StepResult(f"Unknown action {action!r}; try: say red.", 0.0, False)

    def valid_actions(self):
        return [f"say {c}" for c in COLOURS]

    def task_group(self, task_id):
        return COLOURS[task_id % 3]

    def close(self):
        self.closed += 1


class FreeTextEnv(GoodEnv):
    """Actions are not enumerable: `valid_actions` is None."""

    def valid_actions(self):
        return None

    def step(self, action):
        ok = action == "look"
        return StepResult("You see a red ball." if ok else "Nothing happens.", float(ok), ok)


def test_a_correct_env_passes():
    env = GoodEnv()
    check_environment(env)
    assert env.closed == 2


def test_the_unit_test_env_and_free_text_actions_pass():
    check_environment(ColourEnv(), num_tasks=5)
    check_environment(FreeTextEnv(), split="test", seed=3)


def test_an_env_that_never_ends_warns():
    class Endless(GoodEnv):
        def step(self, action):
            return StepResult("Nothing happens.", 0.0, False)

    with pytest.warns(UserWarning, match="no episode ended"):
        check_environment(Endless(), max_steps=3)


def _installed_envs():
    """Installed envs that run with their default options.

    One that needs options first (`remote` needs a server's URL) is checked by
    its own plugin's tests, against a real server.
    """
    host = PluginHost()
    names = host.registry.names("environment")
    registrations = [host.registry.get("environment", n) for n in names]
    return [r for r in registrations if _defaults_build(r.config)]


def _defaults_build(config_model) -> bool:
    from pydantic import ValidationError

    try:
        config_model()
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("registration", _installed_envs(), ids=lambda r: r.name)
def test_installed_environments_pass_with_default_config(registration):
    env = registration.factory(registration.config())
    check_environment(env, num_tasks=2, max_steps=10)


# -- one fake per broken rule ----------------------------------------------------


class NoClose(GoodEnv):
    close = None


class EmptyTasks(GoodEnv):
    def tasks(self, split):
        return []


class ShuffledTasks(GoodEnv):
    def tasks(self, split):
        return random.sample(range(10), 10) if split == "train" else [10]


class OverlappingSplits(GoodEnv):
    def tasks(self, split):
        return [0, 1, 2] if split == "train" else [2, 3]


class StringTasks(GoodEnv):
    def tasks(self, split):
        return ["a", "b"] if split == "train" else ["c"]


class RepeatedTasks(GoodEnv):
    def tasks(self, split):
        return [0, 0, 1] if split == "train" else [2]


class NoInstruction(GoodEnv):
    def instruction(self):
        return "  "


class IntGroup(GoodEnv):
    def task_group(self, task_id):
        return task_id


class EmptyReset(GoodEnv):
    def reset(self, task_id):
        super().reset(task_id)
        return ""


class GymStep(GoodEnv):
    def step(self, action):
        result = super().step(action)
        return result.observation, result.reward, result.done, False, {}


class StringReward(GoodEnv):
    def step(self, action):
        result = super().step(action)
        return StepResult(result.observation, str(result.reward), result.done)


class BoolReward(GoodEnv):
    def step(self, action):
        result = super().step(action)
        return StepResult(result.observation, result.reward > 0, result.done)


class NanReward(GoodEnv):
    def step(self, action):
        result = super().step(action)
        return StepResult(result.observation, float("nan"), result.done)


class IntDone(GoodEnv):
    def step(self, action):
        result = super().step(action)
        return StepResult(result.observation, result.reward, int(result.done))


class EmptyValidActions(GoodEnv):
    def valid_actions(self):
        return []


class TupleValidActions(GoodEnv):
    def valid_actions(self):
        return tuple(super().valid_actions())


class ListedActionCrashes(GoodEnv):
    def valid_actions(self):
        return [*super().valid_actions(), "say purple"]

    def step(self, action):
        if action == "say purple":
            raise KeyError("purple")
        return super().step(action)


class StepCrashes(GoodEnv):
    def step(self, action):
        raise ConnectionError("the simulator went away")


class GarbageRaises(GoodEnv):
    def step(self, action):
        if action not in self.valid_actions():
            raise ValueError(f"invalid action {action!r}")
        return super().step(action)


class GarbageSilent(GoodEnv):
    def step(self, action):
        result = super().step(action)
        return result if action in self.valid_actions() else StepResult("", 0.0, False)


class NoResetAfterDone(GoodEnv):
    def reset(self, task_id):
        if self.done:
            raise RuntimeError("episode over; make a new env")
        return super().reset(task_id)


class RandomObservations(GoodEnv):
    def step(self, action):
        result = super().step(action)
        return StepResult(
            f"{result.observation} ({random.random():.6f})", result.reward, result.done
        )


class CountingObservations(GoodEnv):
    counter = itertools.count()

    def reset(self, task_id):
        return f"{super().reset(task_id)} Episode {next(self.counter)}."


class CloseTwiceFails(GoodEnv):
    def close(self):
        if self.closed:
            raise RuntimeError("already closed")
        super().close()


BROKEN = [
    (NoClose, "protocol", "missing methods ['close']"),
    (EmptyTasks, "tasks", "is empty"),
    (ShuffledTasks, "tasks", "differs between two calls"),
    (OverlappingSplits, "tasks", "share task ids [2]"),
    (StringTasks, "tasks", "task ids must be int"),
    (RepeatedTasks, "tasks", "repeats task ids"),
    (NoInstruction, "instruction", "non-empty str"),
    (IntGroup, "task_group", "must return a str"),
    (EmptyReset, "reset", "non-empty str"),
    (GymStep, "step", "must return StepResult, got tuple"),
    (StringReward, "step", "reward must be a float, got str"),
    (BoolReward, "step", "reward must be a float, got bool"),
    (NanReward, "step", "reward must be finite"),
    (IntDone, "step", "done must be a bool, got int"),
    (EmptyValidActions, "valid_actions", "non-empty list of str"),
    (TupleValidActions, "valid_actions", "non-empty list of str"),
    (ListedActionCrashes, "step", "step('say purple') raised KeyError: 'purple' (at "),
    (StepCrashes, "step", "raised ConnectionError: the simulator went away (at "),
    (GarbageRaises, "invalid_action", "raised ValueError: invalid action"),
    (GarbageSilent, "invalid_action", "explanatory observation"),
    (NoResetAfterDone, "reset_after_done", "raised RuntimeError: episode over"),
    (RandomObservations, "determinism", "same actions, other result"),
    (CountingObservations, "determinism", "reset gave"),
    (CloseTwiceFails, "close", "the second close() raised RuntimeError"),
]


@pytest.mark.parametrize(("cls", "check", "detail"), BROKEN, ids=[c.__name__ for c, *_ in BROKEN])
def test_a_broken_rule_is_named(cls, check, detail):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # each fake ends its episodes: no warning either
        with pytest.raises(EnvironmentCheckError) as caught:
            check_environment(cls())
    error = caught.value
    assert (error.env_class, error.check) == (cls.__name__, check)
    assert check in CHECKS
    assert str(error).startswith(f"{cls.__name__} failed check {check!r}: ")
    assert detail in error.detail


@pytest.mark.parametrize("cls", [StepCrashes, ListedActionCrashes])
def test_an_exception_in_step_names_step_and_where_it_was_raised(cls):
    with pytest.raises(EnvironmentCheckError) as caught:
        check_environment(cls())
    error = caught.value
    assert error.check == "step"  # the method that raised, not the check that was running
    line = next(n for n, text in enumerate(_source_lines(cls), 1) if "raise " in text)
    assert f"(at test_check_environment.py:{line} in step)" in error.detail
    listed = "; valid_actions() listed that action"
    assert error.detail.endswith(listed)


def _source_lines(cls):
    import inspect

    lines, start = inspect.getsourcelines(cls)
    return [""] * (start - 1) + lines


def test_every_check_has_a_broken_fake():
    assert {check for _, check, _ in BROKEN} == set(CHECKS)
