"""What environment methods must return, checked wherever an environment is played.

A wrong type from an environment is a bug in its plugin, not a flaky server:
it stops the run with a message naming the environment, the method, the
value and the fix, instead of surfacing as a `TypeError` deep in the engine,
being counted as an `env_error` episode, or being written into data as
`null`. The rollout engine (train and eval), `agentgym env play`,
`model init`, `data expert` and SFT expert data, `serve-env` and
`check_environment` all check with these functions, so an env is held to the
same rules on every path.

Messages name the environment by its registered name: the caller passes
`name=`, or the env was made by name through `label` (as
`env_options.make_env` does); otherwise by its class and module.
"""

from __future__ import annotations

import numbers
import weakref
from typing import Any, Literal, overload

from agentgym_core.types import StepResult

FIXES = {
    "reset": "return the first observation (the goal and what the agent sees) as a str",
    "instruction": "return the instruction prompt (the rules, the action syntax) as a str",
    "task_group": "return a label for the task (a level name, a difficulty) as a str",
    "valid_actions": "return a list of action strings, or None where actions cannot be listed",
    "expert_action": "return the expert's next action as a str",
    "step": "return StepResult(observation, reward, done) from agentgym_core.api",
}
"""The short fix shown for each method; `fix` picks a more specific one for known mistakes."""

GYM_TUPLES = {
    5: "Gymnasium (obs, reward, terminated, truncated, info)",
    4: "Gym (obs, reward, done, info)",
}
"""The tuples a port from Gymnasium (or the older Gym) returns from `step`, by length."""

_labels: dict[int, str] = {}
"""Registered names of live env instances, by id; an entry goes with its instance."""


class EnvironmentContractError(TypeError):
    """An environment method returned something the Environment protocol does not allow."""


def label(env: Any, name: str) -> Any:
    """Record that `env` was made from the registered name `name`; returns `env`.

    Later messages about `env` name it even where the caller passes no `name`
    (the rollout engine only holds the instance).
    """
    try:
        weakref.finalize(env, _labels.pop, id(env), None)
    except TypeError:  # no weak references (`__slots__`): messages name the class
        return env
    _labels[id(env)] = name
    return env


def describe(env: Any, name: str | None = None) -> str:
    """How messages name `env`: `'babyai' (BabyAIEnv)`, or the class and its module."""
    cls = type(env)
    name = name or _labels.get(id(env))
    if name:
        return f"{name!r} ({cls.__name__})"
    return f"{cls.__name__} ({cls.__module__})"


def fix(method: str, value: Any) -> str:
    """The fix for a wrong `value` from `method` (`"reset"`, `"step"`, ...), one short sentence."""
    if isinstance(value, tuple) and method == "step" and len(value) in GYM_TUPLES:
        return f"return StepResult(observation, reward, done), not a {GYM_TUPLES[len(value)]} tuple"
    if isinstance(value, tuple) and method == "reset" and len(value) == 2:
        return "return only the observation str, not a Gymnasium (obs, info) tuple"
    if method == "step" and isinstance(value, StepResult):
        return "observation a str, reward a float, done and truncated bools, info a dict"
    return FIXES.get(method, "see the Environment protocol in agentgym_core.interfaces")


def _fail(
    env: Any, method: str, expected: str, value: Any, name: str | None, task: Any
) -> EnvironmentContractError:
    shown = repr(value).replace("\n", "\\n")
    shown = shown if len(shown) <= 200 else shown[:197] + "..."
    where = describe(env, name) + ("" if task is None else f", task {task}")
    return EnvironmentContractError(
        f"environment {where}: {method}() must return {expected}, "
        f"got {type(value).__name__}: {shown}. Fix: {fix(method, value)}"
    )


@overload
def text(
    env: Any,
    method: str,
    value: Any,
    *,
    optional: Literal[False] = False,
    name: str | None = None,
    task: Any = None,
) -> str: ...


@overload
def text(
    env: Any, method: str, value: Any, *, optional: bool, name: str | None = None, task: Any = None
) -> str | None: ...


def text(
    env: Any,
    method: str,
    value: Any,
    *,
    optional: bool = False,
    name: str | None = None,
    task: Any = None,
) -> str | None:
    """A `str` (or None where `optional`): `reset`, `instruction`, `task_group`, `expert_action`.

    Args:
        env: the environment that returned `value`.
        method: the method's name, without parentheses (`"reset"`).
        value: what it returned.
        optional: None is allowed too.
        name: the env's registered name, for the message (default: its label or class).
        task: the task being played, for the message.
    """
    if isinstance(value, str) or (optional and value is None):
        return value
    expected = "a str" + (" or None" if optional else "")
    raise _fail(env, method, expected, value, name, task)


def actions(env: Any, value: Any, *, name: str | None = None, task: Any = None) -> list[str] | None:
    """`valid_actions()`: None, or a list of strings (`name`, `task` as in `text`)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)) and all(isinstance(a, str) for a in value):
        return list(value)
    raise _fail(env, "valid_actions", "None or a list of str", value, name, task)


def step(env: Any, value: Any, *, name: str | None = None, task: Any = None) -> StepResult:
    """`step()`: a StepResult with a str observation, a real reward and bool flags.

    `name` and `task` are as in `text`.
    """
    if not isinstance(value, StepResult):
        raise _fail(env, "step", "agentgym_core.types.StepResult", value, name, task)
    problems = []
    if not isinstance(value.observation, str):
        problems.append(f"observation is {type(value.observation).__name__}, not str")
    if not isinstance(value.reward, numbers.Real) or isinstance(value.reward, bool):
        problems.append(f"reward is {type(value.reward).__name__}, not a number")
    for flag in ("done", "truncated"):
        if not isinstance(getattr(value, flag), (bool, int)):
            problems.append(f"{flag} is {type(getattr(value, flag)).__name__}, not bool")
    if not isinstance(value.info, dict):
        problems.append(f"info is {type(value.info).__name__}, not dict")
    if problems:
        expected = "a well-typed StepResult (" + "; ".join(problems) + ")"
        raise _fail(env, "step", expected, value, name, task)
    return value
