"""Expert demonstrations of any environment that offers `expert_action()`, as AgentTraj JSON.

AgentTraj (AgentGym's trajectory format) is a JSON list of
`{"item_id": "<env>_<task>", "conversations": [{"from", "loss", "value"}, ...]}`:
the instruction, the priming "Ok." (loss false), then observation/action turns
with `loss: true` on the actions to train on.

Every value the env returns (instruction, observations, the expert's actions,
step results) is checked by `rollout.contract` before it becomes a turn: a
wrong type stops the whole run naming the env and the task, so no file ever
holds a `null` turn or an episode built from a misread step.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

from agentgym_core.interfaces import Environment
from agentgym_core.rollout import contract
from agentgym_core.rollout.chat import PRIMING_REPLY
from agentgym_core.rollout.threads import EnvCallTimeout, timed_call


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
) -> dict[str, Any]:
    """Play one episode with the expert; returns the conversation and the outcome.

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


def expert_items(
    env: Any,
    env_name: str,
    task_ids: Sequence[int],
    *,
    max_turns: int = 64,
    timeout_s: float = 30.0,
) -> ExpertRun:
    """AgentTraj items of the successful expert episodes of `task_ids`, with counts.

    A wrong type from the env raises `contract.EnvironmentContractError`, and
    an env call longer than `timeout_s` an `EnvCallTimeout` naming the env and
    the task: either way there are no items at all.
    """
    if not isinstance(env, ExpertEnvironment):
        raise TypeError(f"environment {env_name!r} has no expert_action(); it cannot write experts")
    items, successes, steps = [], 0, 0
    for task_id in task_ids:
        try:
            episode = expert_episode(env, task_id, max_turns, name=env_name, timeout_s=timeout_s)
        except EnvCallTimeout as error:
            raise EnvCallTimeout(
                f"environment {env_name!r}, task {task_id}: {error}; left running, stopping",
                error.pending,
            ) from None
        successes += episode["success"]
        steps += episode["steps"]
        if episode["success"]:
            items.append(
                {"item_id": f"{env_name}_{task_id}", "conversations": episode["conversations"]}
            )
    return ExpertRun(items, successes, steps)


def write_expert_dataset(
    env: Any,
    env_name: str,
    task_ids: Sequence[int],
    path: Path,
    *,
    max_turns: int = 64,
    timeout_s: float = 30.0,
) -> dict[str, float]:
    """Write successful expert episodes of `task_ids` to `path`; returns counts and success rate.

    `episodes` is the number of episodes written (an int). Nothing is written
    when the env breaks the contract.
    """
    items, successes, _ = expert_items(
        env, env_name, task_ids, max_turns=max_turns, timeout_s=timeout_s
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(items, indent=1))
    total = max(len(task_ids), 1)
    return {"episodes": len(items), "success_rate": successes / total}
