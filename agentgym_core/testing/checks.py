"""`check_environment`: conformance checks for an Environment plugin, like Gymnasium's check_env.

The rollout engine trusts the protocol: it replays task ids for resume and
evaluation, scores rewards as floats, and marks an exception as `env_error`.
These checks catch the mistakes that would otherwise show up as a silently
wrong training run.
"""

from __future__ import annotations

import math
import random
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from agentgym_core.rollout import contract
from agentgym_core.types import StepResult

METHODS = ("tasks", "instruction", "reset", "step", "valid_actions", "task_group", "close")
"""What `agentgym_core.interfaces.Environment` requires."""

CHECKS = (
    "protocol",
    "tasks",
    "instruction",
    "task_group",
    "reset",
    "step",
    "valid_actions",
    "invalid_action",
    "reset_after_done",
    "determinism",
    "close",
)
"""Names of the checks, as `EnvironmentCheckError.check` reports them."""

GARBAGE_ACTION = "xyzzy plugh 12345 !@#"
"""An action no environment should know; it must get an observation, not an exception."""


class EnvironmentCheckError(AssertionError):
    """An environment broke one rule of the protocol.

    Attributes:
        env_class: the class name of the environment checked.
        check: which check failed (one of `CHECKS`).
        detail: what was wrong.
    """

    def __init__(self, env_class: str, check: str, detail: str) -> None:
        super().__init__(f"{env_class} failed check {check!r}: {detail}")
        self.env_class, self.check, self.detail = env_class, check, detail


def _fix(method: str, value: Any) -> str:
    """The contract's fix for a wrong value, as it reads in training: `. Fix: return ...`."""
    return f". Fix: {contract.fix(method, value)}"


class _Checker:
    """Names the environment and the current check in every failure."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.name = type(env).__name__

    def fail(self, check: str, detail: str) -> NoReturn:
        raise EnvironmentCheckError(self.name, check, detail)

    @contextmanager
    def guard(self, check: str, doing: str, note: str = "") -> Iterator[None]:
        """Turn an exception of the environment into a failure of `check`, where it was raised."""
        try:
            yield
        except EnvironmentCheckError:
            raise
        except Exception as error:  # noqa: BLE001 - any exception is the finding
            raise EnvironmentCheckError(
                self.name,
                check,
                f"{doing} raised {type(error).__name__}: {error}{_at(error)}{note}",
            ) from error

    def reset(self, task: int, check: str = "reset") -> str:
        with self.guard(check, f"reset({task!r})"):
            first = self.env.reset(task)
        if not isinstance(first, str) or not first:
            self.fail(
                check,
                f"reset({task!r}) must return a non-empty str, got {first!r}"
                + _fix("reset", first),
            )
        return first

    def step(self, action: str, crash_check: str = "step", listed: bool = False) -> StepResult:
        """Step and check the result's types; an exception fails `crash_check`.

        `listed`: the action is one `valid_actions()` offered (said in a failure).
        """
        note = "; valid_actions() listed that action" if listed else ""
        with self.guard(crash_check, f"step({action!r})", note):
            result = self.env.step(action)
        check, where = "step", f"step({action!r})"
        if not isinstance(result, StepResult):
            self.fail(
                check,
                f"{where} must return StepResult, got {type(result).__name__}"
                + _fix("step", result),
            )
        if not isinstance(result.observation, str):
            self.fail(check, f"{where}: observation must be a str, got {result.observation!r}")
        reward = result.reward
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            self.fail(check, f"{where}: reward must be a float, got {type(reward).__name__}")
        if not math.isfinite(reward):
            self.fail(check, f"{where}: reward must be finite, got {reward!r}")
        for field in ("done", "truncated"):
            value = getattr(result, field)
            if not isinstance(value, bool):
                self.fail(check, f"{where}: {field} must be a bool, got {type(value).__name__}")
        if not isinstance(result.info, dict):
            self.fail(check, f"{where}: info must be a dict, got {type(result.info).__name__}")
        return result

    def valid_actions(self) -> list[str] | None:
        with self.guard("valid_actions", "valid_actions()"):
            actions = self.env.valid_actions()
        if actions is None:
            return None
        if (
            not isinstance(actions, list)
            or not actions
            or not all(isinstance(a, str) and a for a in actions)
        ):
            self.fail(
                "valid_actions",
                f"must be None or a non-empty list of str, got {actions!r}"
                + _fix("valid_actions", actions),
            )
        return actions


def _at(error: BaseException) -> str:
    """` (at file:line in function)` of the innermost frame that raised `error`, else ''."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {Path(last.filename).name}:{last.lineno} in {last.name})"


def _check_tasks(c: _Checker, split: str) -> list[int]:
    other = "test" if split == "train" else "train"
    with c.guard("tasks", "tasks()"):
        tasks, again, others = c.env.tasks(split), c.env.tasks(split), c.env.tasks(other)
    tasks, again, others = list(tasks), list(again), list(others)
    if not tasks:
        c.fail("tasks", f"tasks({split!r}) is empty")
    if any(isinstance(t, bool) or not isinstance(t, int) for t in tasks):
        c.fail("tasks", f"task ids must be int, got {tasks[:5]!r}...")
    if len(set(tasks)) != len(tasks):
        c.fail("tasks", f"tasks({split!r}) repeats task ids")
    if tasks != again:
        c.fail("tasks", f"tasks({split!r}) differs between two calls")
    shared = set(tasks) & set(others)
    if shared:
        c.fail("tasks", f"splits {split!r} and {other!r} share task ids {sorted(shared)[:5]}")
    return tasks


def _play(
    c: _Checker, task: int, actions: list[str] | None, max_steps: int, rng: random.Random
) -> tuple[list[str], list[tuple[Any, ...]], bool]:
    """One episode: random valid actions, or replay `actions`. Returns actions, transcript, done."""
    transcript: list[tuple[Any, ...]] = [(c.reset(task),)]
    taken: list[str] = []
    done = False
    for i in range(max_steps if actions is None else len(actions)):
        valid = c.valid_actions()
        if actions is not None:  # replaying
            action = actions[i]
        elif valid:
            action = rng.choice(valid)
        else:
            action = "look"
        result = c.step(action, listed=bool(valid) and actions is None)
        taken.append(action)
        transcript.append((action, valid, result.observation, result.reward, result.done))
        if result.done:
            done = True
            break
    return taken, transcript, done


def _check_each_valid_action(c: _Checker, task: int) -> None:
    c.reset(task)
    for action in c.valid_actions() or []:
        c.reset(task)
        c.step(action, listed=True)


def _check_invalid_action(c: _Checker, task: int) -> None:
    c.reset(task)
    if GARBAGE_ACTION in (c.valid_actions() or []):
        c.fail("valid_actions", f"lists the garbage action {GARBAGE_ACTION!r}")
    result = c.step(GARBAGE_ACTION, crash_check="invalid_action")
    if not result.observation.strip():
        c.fail("invalid_action", "an invalid action must get an explanatory observation")


def check_environment(
    env: Any, *, split: str = "train", num_tasks: int = 3, max_steps: int = 20, seed: int = 0
) -> None:
    """Raise `EnvironmentCheckError` unless `env` follows the Environment protocol.

    Plays random valid actions (or `"look"` where actions are not enumerable)
    on the first `num_tasks` tasks of `split`, at most `max_steps` each, then
    replays them. Checks: `tasks` deterministic, int, and disjoint from the
    other split; a non-empty `instruction`; `task_group` a str; `reset` a
    non-empty str; `step` a well-typed `StepResult`; `valid_actions` None or a
    non-empty list of str, each accepted by `step`; a garbage action answered,
    not raised; reset after done; same task and actions, same observations;
    `close` idempotent. Closes `env`.

    Args:
        env: the object claiming `agentgym_core.interfaces.Environment`.
        split: the split whose tasks are played; the other of train/test must be disjoint.
        num_tasks: how many tasks to play.
        max_steps: the step limit of each played episode.
        seed: seeds the choice of random actions.
    """
    c = _Checker(env)
    missing = [m for m in METHODS if not callable(getattr(env, m, None))]
    if missing:
        c.fail("protocol", f"missing methods {missing}")
    tasks = _check_tasks(c, split)
    with c.guard("instruction", "instruction()"):
        instruction = env.instruction()
    if not isinstance(instruction, str) or not instruction.strip():
        c.fail(
            "instruction",
            f"must return a non-empty str, got {instruction!r}" + _fix("instruction", instruction),
        )
    rng = random.Random(seed)
    ever_done = False
    for task in tasks[:num_tasks]:
        with c.guard("task_group", f"task_group({task!r})"):
            group = env.task_group(task)
        if not isinstance(group, str):
            c.fail(
                "task_group",
                f"task_group({task!r}) must return a str, got {group!r}"
                + _fix("task_group", group),
            )
        actions, transcript, done = _play(c, task, None, max_steps, rng)
        ever_done |= done
        again = c.reset(task, check="reset_after_done" if done else "reset")
        if again != transcript[0][0]:
            c.fail("determinism", f"task {task}: reset gave {transcript[0][0]!r}, then {again!r}")
        _, replay, _ = _play(c, task, actions, max_steps, rng)
        for before, after in zip(transcript, replay, strict=False):
            if before != after:
                c.fail(
                    "determinism",
                    f"task {task}: same actions, other result: {before!r} then {after!r}",
                )
        if len(replay) != len(transcript):
            c.fail("determinism", f"task {task}: same actions, the episode ended elsewhere")
        _check_each_valid_action(c, task)
        _check_invalid_action(c, task)
    if not ever_done:
        warnings.warn(
            f"{c.name}: no episode ended within {max_steps} random steps; "
            "reset after done was not checked",
            stacklevel=2,
        )
    for attempt in ("first", "second"):
        with c.guard("close", f"the {attempt} close()"):
            env.close()
