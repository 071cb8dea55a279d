"""Expert demonstrations of any environment that offers `expert_action()`, as AgentTraj JSON.

AgentTraj (AgentGym's trajectory format) is a JSON list of
`{"item_id": "<env>_<task>", "conversations": [{"from", "loss", "value"}, ...]}`:
the instruction, the priming "Ok." (loss false), then observation/action turns
with `loss: true` on the actions to train on.

Every value the env returns (instruction, observations, the expert's actions,
step results) is checked by `rollout.contract` before it becomes a turn: a
wrong type stops the whole run naming the env and the task, so no file ever
holds a `null` turn or an episode built from a misread step.

A takeover (DAgger-style data, arXiv 1011.0686): the expert takes over an
episode after another policy's first turns (a `RollIn`), which are replayed
and kept as context (`loss: false`). Cloning shows a student only the
expert's own states; a takeover shows it how the expert recovers from the
states the student reaches.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import random
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

from agentgym_core.interfaces import Environment
from agentgym_core.rollout import contract
from agentgym_core.rollout.chat import PRIMING_REPLY
from agentgym_core.rollout.threads import EnvCallTimeout, timed_call
from agentgym_core.types import Termination, Trajectory


class RollIn(NamedTuple):
    """Turns another policy played before the expert takes over: its actions, the env's answers."""

    actions: tuple[str, ...]
    observations: tuple[str, ...]


class ReplayDiverged(Exception):
    """The env answered a replayed roll-in unlike the play it came from (or ended the episode)."""


def cut_roll_in(trajectory: Trajectory, seed: int) -> RollIn | None:
    """The first turns of a played episode, cut at a seeded turn, for the expert to take over.

    The cut falls uniformly on turns 1..T of its T turns, 1..T-1 where its last turn ended
    the episode (the expert needs a state to act in). None for an episode that ended in an
    env error or has no turn to cut after.
    """
    turns = trajectory.turns
    last = len(turns) - (trajectory.termination == Termination.DONE)
    if trajectory.termination == Termination.ENV_ERROR or last < 1:
        return None
    cut = random.Random(f"{seed}:{trajectory.task_id}").randint(1, last)
    return RollIn(tuple(t.action for t in turns[:cut]), tuple(t.observation for t in turns[:cut]))


@runtime_checkable
class ExpertEnvironment(Environment, Protocol):
    """An environment that can name a good next action (a planner, a bot, a gold path)."""

    def expert_action(self) -> str:
        """The expert's next action in the current episode."""
        ...


def expert_episode(
    env: ExpertEnvironment,
    task_id: int,
    max_turns: int,
    *,
    name: str | None = None,
    timeout_s: float = 30.0,
    roll_in: RollIn | None = None,
) -> dict[str, Any]:
    """Play one episode with the expert; returns the conversation and the outcome.

    With `roll_in`, its actions are replayed first (turns with `loss: false`),
    and the expert then has `max_turns` turns of its own; `ReplayDiverged` when
    an observation differs from the roll-in's or the replay ends the episode.
    Raises `contract.EnvironmentContractError` (naming the env, `name` where
    given, and the task) when a method returns a wrong type, and
    `EnvCallTimeout` when a call runs longer than `timeout_s` (it is left
    running on a daemon thread, so the process can still exit).
    """

    def call(fn: Any, *args: Any) -> Any:
        return timed_call(fn, *args, timeout_s=timeout_s)

    instruction = contract.text(env, "instruction", call(env.instruction), name=name, task=task_id)
    observation = contract.text(env, "reset", call(env.reset, task_id), name=name, task=task_id)
    conversation = [
        {"from": "human", "loss": None, "value": instruction},
        {"from": "gpt", "loss": False, "value": PRIMING_REPLY},
        {"from": "human", "loss": None, "value": observation},
    ]
    for action, expected in zip(*(roll_in or ((), ())), strict=True):
        result = contract.step(env, call(env.step, action), name=name, task=task_id)
        if result.observation != expected or result.done or result.truncated:
            raise ReplayDiverged(f"task {task_id}: the replayed {action!r} was answered otherwise")
        conversation.append({"from": "gpt", "loss": False, "value": action})
        conversation.append({"from": "human", "loss": None, "value": result.observation})
    reward, success, steps = 0.0, False, 0
    for _ in range(max_turns):
        action = contract.text(
            env, "expert_action", call(env.expert_action), name=name, task=task_id
        )
        result = contract.step(env, call(env.step, action), name=name, task=task_id)
        steps += 1
        conversation.append({"from": "gpt", "loss": True, "value": action})
        reward += result.reward
        if result.done:
            success = bool(result.info.get("success", result.reward > 0))
            break
        conversation.append({"from": "human", "loss": None, "value": result.observation})
    return {"conversations": conversation, "reward": reward, "success": success, "steps": steps}


class ExpertRun(NamedTuple):
    """What an expert's episodes gave: the successful ones as AgentTraj items, and their cost."""

    items: list[dict[str, Any]]
    successes: int
    env_steps: int
    """Actions taken in every episode, failed ones included (the data's price in env steps)."""
    diverged: int = 0
    """Roll-ins whose replay the env answered otherwise (no episode played)."""


def expert_items(
    env: Any,
    env_name: str,
    task_ids: Sequence[int],
    *,
    max_turns: int = 64,
    timeout_s: float = 30.0,
    roll_ins: Sequence[RollIn | None] | None = None,
) -> ExpertRun:
    """AgentTraj items of the successful expert episodes of `task_ids`, with counts.

    `roll_ins[i]`, where given, is replayed before the expert takes over task
    `task_ids[i]`; its item records `roll_in_turns`. A wrong type from the env
    raises `contract.EnvironmentContractError`, and an env call longer than
    `timeout_s` an `EnvCallTimeout` naming the env and the task: either way
    there are no items at all.
    """
    if not isinstance(env, ExpertEnvironment):
        raise TypeError(f"environment {env_name!r} has no expert_action(); it cannot write experts")
    if roll_ins is None:
        roll_ins = [None] * len(task_ids)
    items, successes, steps, diverged = [], 0, 0, 0
    for task_id, roll_in in zip(task_ids, roll_ins, strict=True):
        try:
            episode = expert_episode(
                env, task_id, max_turns, name=env_name, timeout_s=timeout_s, roll_in=roll_in
            )
        except ReplayDiverged:
            diverged += 1
            continue
        except EnvCallTimeout as error:
            raise EnvCallTimeout(
                f"environment {env_name!r}, task {task_id}: {error}; left running, stopping",
                error.pending,
            ) from None
        successes += episode["success"]
        steps += episode["steps"]
        if episode["success"]:
            item = {"item_id": f"{env_name}_{task_id}"}
            if roll_in is not None:
                item["roll_in_turns"] = len(roll_in.actions)
            items.append({**item, "conversations": episode["conversations"]})
    return ExpertRun(items, successes, steps, diverged)


def expert_items_in_processes(
    make_env: Callable[[], Any],
    env_name: str,
    task_ids: Sequence[int],
    *,
    workers: int,
    max_turns: int = 64,
    timeout_s: float = 30.0,
    roll_ins: Sequence[RollIn | None] | None = None,
) -> ExpertRun:
    """`expert_items`, the tasks split into `workers` shares played in processes at once.

    Each share is a run of consecutive tasks, played with its own env (`make_env()`,
    picklable) in a process of its own. An expert (a planner, a bot, a search) is
    Python that holds one core; on a machine of several the shares finish in a
    fraction of the time. The items are the same, in the same order, as one process
    gives, for an expert that depends only on its task.
    Processes are spawned, not forked: the caller may hold threads (a tracker, a policy).
    """
    tasks = list(task_ids)
    plays = list(roll_ins) if roll_ins is not None else [None] * len(tasks)
    workers = max(1, min(workers, len(tasks)))
    size = -(-len(tasks) // workers)  # ceiling: every share but the last is full
    starts = range(0, len(tasks), size)
    shares = [tasks[start : start + size] for start in starts]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(shares), mp_context=context) as pool:
        runs = list(
            pool.map(
                _play_share,
                [make_env] * len(shares),
                [env_name] * len(shares),
                shares,
                [max_turns] * len(shares),
                [timeout_s] * len(shares),
                [plays[start : start + size] for start in starts],
            )
        )
    return ExpertRun(
        [item for run in runs for item in run.items],
        sum(run.successes for run in runs),
        sum(run.env_steps for run in runs),
        sum(run.diverged for run in runs),
    )


def _play_share(
    make_env: Callable[[], Any],
    env_name: str,
    tasks: list[int],
    max_turns: int,
    timeout_s: float,
    roll_ins: list[RollIn | None],
) -> ExpertRun:
    """One process's share of `expert_items_in_processes`."""
    env = make_env()
    try:
        return expert_items(
            env, env_name, tasks, max_turns=max_turns, timeout_s=timeout_s, roll_ins=roll_ins
        )
    except EnvCallTimeout as error:
        # its pending call cannot cross to the parent; the message names env and task
        raise TimeoutError(str(error)) from None
    finally:
        with contextlib.suppress(EnvCallTimeout):  # a wedged env may not close either
            timed_call(env.close, timeout_s=5.0)


def write_expert_dataset(
    env: Any,
    env_name: str,
    task_ids: Sequence[int],
    path: Path,
    *,
    max_turns: int = 64,
    timeout_s: float = 30.0,
    workers: int = 1,
    make_env: Callable[[], Any] | None = None,
) -> dict[str, float]:
    """Write successful expert episodes of `task_ids` to `path`; returns counts and success rate.

    `episodes` is the number of episodes written (an int). Nothing is written
    when the env breaks the contract. With `workers` above 1, processes with envs
    of `make_env()` share the tasks (`expert_items_in_processes`) and `env` is not
    played.
    """
    if workers > 1:
        if make_env is None:
            raise ValueError("workers above 1 need make_env: each process makes its own env")
        run = expert_items_in_processes(
            make_env, env_name, task_ids, workers=workers, max_turns=max_turns, timeout_s=timeout_s
        )
    else:
        run = expert_items(env, env_name, task_ids, max_turns=max_turns, timeout_s=timeout_s)
    items, successes = run.items, run.successes
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(items, indent=1))
    total = max(len(task_ids), 1)
    return {"episodes": len(items), "success_rate": successes / total}
