"""Expert demonstrations of any environment that offers `expert_action()`, as AgentTraj JSON.

AgentTraj (AgentGym's trajectory format) is a JSON list of
`{"item_id": "<env>_<task>", "conversations": [{"from", "loss", "value"}, ...]}`:
the instruction, the priming "Ok." (loss false), then observation/action turns
with `loss: true` on the actions to train on.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

from agentgym_core.interfaces import Environment
from agentgym_core.rollout.chat import PRIMING_REPLY


@runtime_checkable
class ExpertEnvironment(Environment, Protocol):
    """An environment that can name a good next action (a planner, a bot, a gold path)."""

    def expert_action(self) -> str:
        """The expert's next action in the current episode."""
        ...


def expert_episode(env: ExpertEnvironment, task_id: int, max_turns: int) -> dict[str, Any]:
    """Play one episode with the expert; returns the conversation and the outcome."""
    instruction = env.instruction()
    observation = env.reset(task_id)
    conversation = [
        {"from": "human", "loss": None, "value": instruction},
        {"from": "gpt", "loss": False, "value": PRIMING_REPLY},
        {"from": "human", "loss": None, "value": observation},
    ]
    reward, success, steps = 0.0, False, 0
    for _ in range(max_turns):
        action = env.expert_action()
        result = env.step(action)
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
    env: Any, env_name: str, task_ids: Sequence[int], *, max_turns: int = 64
) -> ExpertRun:
    """AgentTraj items of the successful expert episodes of `task_ids`, with counts."""
    if not isinstance(env, ExpertEnvironment):
        raise TypeError(f"environment {env_name!r} has no expert_action(); it cannot write experts")
    items, successes, steps = [], 0, 0
    for task_id in task_ids:
        episode = expert_episode(env, task_id, max_turns)
        successes += episode["success"]
        steps += episode["steps"]
        if episode["success"]:
            items.append(
                {"item_id": f"{env_name}_{task_id}", "conversations": episode["conversations"]}
            )
    return ExpertRun(items, successes, steps)


def write_expert_dataset(
    env: Any, env_name: str, task_ids: Sequence[int], path: Path, *, max_turns: int = 64
) -> dict[str, float]:
    """Write successful expert episodes of `task_ids` to `path`; returns counts and success rate."""
    items, successes, _ = expert_items(env, env_name, task_ids, max_turns=max_turns)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(items, indent=1))
    total = max(len(task_ids), 1)
    return {"episodes": float(len(items)), "success_rate": successes / total}
