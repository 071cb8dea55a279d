"""Episodes lost to the environment, played again: one policy for training and evaluation.

An update whose episodes (mostly) ended in `env_error` has nothing to learn
from, and an evaluation with env errors measures only the episodes that
survived. Both follow `replay_env_errors`: an episode that ended in
env_error is played again (same task, group, sample and seed), up to
`retries` times. While only a few failed, a replay is immediate (another env
server may answer; a broken task costs no wait); when `outage_fraction` of
them or more failed, the environment is probed first: a probe builds a new
instance (for `remote`, a new session on the server: its create and reset),
resets it to a known task and closes it, with backoff (1, 2, 4 ... 30 s)
until it answers or `recovery_s` has passed. Every wait is
said on the console, with the reason. What still fails is the caller's to
judge: training stops on an outage, evaluation reports a partial result.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym_core import distributed
from agentgym_core.types import Termination, Trajectory

MAX_BACKOFF_S = 30.0


def is_env_error(trajectory: Trajectory) -> bool:
    """Whether the episode ended because the environment failed (not the agent)."""
    return trajectory.termination == Termination.ENV_ERROR


def env_errors(trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """The episodes that ended in env_error."""
    return [t for t in trajectories if is_env_error(t)]


def is_outage(failed: int, total: int, fraction: float) -> bool:
    """Whether `failed` env_error episodes of `total` make an outage (`fraction` or more)."""
    return total > 0 and failed >= fraction * total


def last_error(trajectories: Sequence[Trajectory]) -> str:
    """The newest error message among `trajectories` (`no message` when none says)."""
    return next((t.error for t in reversed(trajectories) if t.error), "no message")


def probe(env_factory: Callable[[], Any], tasks: Sequence[Any], timeout_s: float) -> str | None:
    """None when a new env resets to one of `tasks` (the first 3 tried) within `timeout_s`.

    Else what went wrong with the last one tried. More than one task, so that one
    broken task does not pass for an outage.
    """
    outcome: list[str | None] = []

    def attempt() -> None:
        env = None
        try:
            env = env_factory()
            for index, task in enumerate(tasks[:3]):
                try:
                    env.reset(task)
                    outcome.append(None)
                    return
                except Exception:
                    if index == len(tasks[:3]) - 1:
                        raise
        except Exception as error:  # noqa: BLE001 - any failure means "not back yet"
            outcome.append(f"{type(error).__name__}: {error}")
        finally:
            if env is not None:
                with contextlib.suppress(Exception):  # closing a broken env may fail too
                    env.close()

    worker = threading.Thread(target=attempt, name="agentgym-env-probe", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if not outcome:
        return f"no answer within {timeout_s:g} s"
    return outcome[0]


def wait_for_env(
    env_factory: Callable[[], Any],
    tasks: Sequence[Any],
    *,
    deadline: float,
    timeout_s: float,
    say: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Probe until the env answers (True) or `deadline` (a `clock()` time) passes (False)."""
    backoff, started = 1.0, clock()
    while True:
        problem = probe(env_factory, tasks, timeout_s)
        if problem is None:
            say(f"the environment answers again after {clock() - started:.0f} s")
            return True
        left = deadline - clock()
        if left <= 0:
            say(f"the environment is still down: {problem}")
            return False
        pause = min(backoff, left, MAX_BACKOFF_S)
        say(f"the environment is down ({problem}); next probe in {pause:.0f} s")
        sleep(pause)
        backoff *= 2


@dataclass(frozen=True)
class ReplayRules:
    """How episodes that ended in env_error are played again."""

    retries: int
    """Times an episode is played again at most (`rollout.env_error_retries`)."""
    outage_fraction: float
    """This share of the episodes failing is an outage: wait for the env before replaying
    (fewer are replayed at once)."""
    recovery_s: float
    """The longest wait for the env, over all replays (`rollout.env_recovery_s`)."""
    probe_timeout_s: float
    """How long one probe may take (`rollout.env_timeout_s`)."""


def replay_env_errors(
    play: Callable[[list[Any]], list[Trajectory]],
    episodes: Sequence[Any],
    played: Sequence[Trajectory],
    rules: ReplayRules,
    env_factory: Callable[[], Any],
    *,
    say: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[list[Trajectory], int]:
    """`played` (the trajectories of `episodes`) with env_error episodes played again.

    `play(specs)` plays episode specs and returns their trajectories in order,
    on every rank (a collective under `accelerate launch`, as the decisions
    here are: every rank sees the same trajectories). Returns the trajectories
    and how many episodes were played again.
    """
    trajectories, replayed = list(played), 0
    deadline = clock() + rules.recovery_s
    for attempt in range(1, rules.retries + 1):
        failed = [i for i, t in enumerate(trajectories) if is_env_error(t)]
        if not failed:
            break
        waits = is_outage(len(failed), len(trajectories), rules.outage_fraction)
        when = f"once the env answers (waiting up to {rules.recovery_s:g} s)" if waits else "now"
        say(
            f"{len(failed)} of {len(trajectories)} episodes ended in env_error (last: "
            f"{last_error([trajectories[i] for i in failed])}); replay {attempt} of "
            f"{rules.retries} {when}"
        )
        if waits:
            tasks = list(dict.fromkeys(episodes[i].task_id for i in failed))
            answered = wait_for_env(
                env_factory,
                tasks,
                deadline=deadline,
                timeout_s=rules.probe_timeout_s,
                say=say,
                sleep=sleep,
                clock=clock,
            )
            if not all(distributed.gather([answered])):  # ranks agree, or none replays
                break
        again = play([episodes[i] for i in failed])
        for index, trajectory in zip(failed, again, strict=True):
            trajectories[index] = trajectory
        replayed += len(failed)
    return trajectories, replayed
