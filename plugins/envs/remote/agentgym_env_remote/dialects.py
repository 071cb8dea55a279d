"""The two protocol families of AgentGym's env servers, and each server's variant.

Family A is keyed by `id` (BabyAI, SciWorld, TextCraft, ALFWorld, LMRL-Gym),
Family B by `env_idx` (SearchQA and the tool envs, WebShop, SQLGym, WebArena).
A `Dialect` says how to build each request and read each reply; the HTTP
work itself is in `client.py`, the episode logic in `env.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from agentgym_env_remote import prompts


class ProtocolError(ValueError):
    """A reply that does not have the shape the protocol says."""


@dataclass(frozen=True)
class Reply:
    """One reset or step reply, normalised."""

    observation: str | None
    reward: float = 0.0
    score: float | None = None
    done: bool = False
    truncated: bool = False
    actions: list[str] | None = None
    task_group: str | None = None
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Dialect:
    """How one kind of AgentGym server is spoken to."""

    name: str
    family: Literal["A", "B"]
    reset_fields: Callable[[int], dict[str, Any]]
    """The reset body besides the id key, from a task id."""
    parse_action: Callable[[str], str] = prompts.after_action
    create_body: dict[str, Any] | None = None
    """JSON body of `POST /create`; None sends none, as AgentGym's clients for that server."""
    score_scale: float | None = None
    """Rewards come as a running score out of this (SciWorld: 100): reward = score gain / scale."""
    success_reward: float = 0.0
    """An episode succeeds when it ends with a step reward above this."""
    task_description_first: bool = False
    """SciWorld: the reset observation is `task_description` + newline + `observation`."""
    ids_only_grow: bool = True
    """The server counts env ids up and never hands one out twice in a life (all but WebShop
    and SQLGym, which draw them at random and share them once full): an id handed out again
    means it restarted."""

    @property
    def id_key(self) -> str:
        """The field naming an env instance: `id` (Family A) or `env_idx` (Family B)."""
        return "id" if self.family == "A" else "env_idx"

    @property
    def instruction(self) -> str | None:
        """AgentGym's instruction prompt for this env, when it is written down here."""
        return prompts.INSTRUCTIONS.get(self.name)

    # -- replies ----------------------------------------------------------------------

    def env_id(self, reply: Any) -> int:
        """The env id a `POST /create` reply holds (`{"id"}`, `{"env_idx"}` or a bare int)."""
        if isinstance(reply, dict):
            reply = reply.get(self.id_key, reply.get("id", reply.get("env_idx")))
        if isinstance(reply, bool) or not isinstance(reply, int):
            raise ProtocolError(f"{self.name}: /create answered no env id: {reply!r}")
        return reply

    def reset_reply(self, reply: Any) -> Reply:
        """Normalise a reset reply: a string, a list led by one, or an object."""
        if isinstance(reply, str):
            return Reply(reply)
        if isinstance(reply, list):  # WebShop: [observation, info]; read /observation instead
            return Reply(None)
        if not isinstance(reply, dict):
            raise ProtocolError(f"{self.name}: unexpected /reset reply {reply!r}")
        observation = _text(reply)
        if self.task_description_first and "task_description" in reply:
            observation = f"{reply['task_description']}\n{observation or ''}"
        return Reply(
            observation,
            score=_number(reply.get("score")),
            actions=_actions(reply),
            task_group=reply.get("task_group")
            if isinstance(reply.get("task_group"), str)
            else None,
        )

    def step_reply(self, reply: Any) -> Reply:
        """Normalise a step reply (`done`, or WebArena's `terminated`/`truncated`)."""
        if not isinstance(reply, dict):
            raise ProtocolError(f"{self.name}: unexpected /step reply {reply!r}")
        observation = _text(reply)
        if observation is None:
            raise ProtocolError(f"{self.name}: /step reply has no observation: {reply!r}")
        reward = _number(reply.get("reward"))
        if reward is None:
            raise ProtocolError(f"{self.name}: /step reply has no numeric reward: {reply!r}")
        info = reply.get("info") if isinstance(reply.get("info"), dict) else {}
        return Reply(
            observation,
            reward=reward,
            score=_number(reply.get("score")),
            done=bool(reply.get("done", False) or reply.get("terminated", False)),
            truncated=bool(reply.get("truncated", False)),
            actions=_actions(reply),
            info=info,
        )


def _text(reply: dict[str, Any]) -> str | None:
    for key in ("observation", "state"):
        value = reply.get(key)
        if isinstance(value, str):
            return value
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _actions(reply: dict[str, Any]) -> list[str] | None:
    value = reply.get("available_actions")
    if isinstance(value, list) and value and all(isinstance(a, str) for a in value):
        return list(value)
    return None


def _data_idx(task: int) -> dict[str, Any]:
    return {"data_idx": task}


DIALECTS: dict[str, Dialect] = {
    d.name: d
    for d in [
        # Family A: keyed by `id`.
        Dialect("babyai", "A", _data_idx, success_reward=0.5),
        Dialect(
            "sciworld",
            "A",
            _data_idx,
            score_scale=100.0,
            success_reward=0.0,
            task_description_first=True,
        ),
        Dialect("textcraft", "A", _data_idx, prompts.textcraft_action, create_body={}),
        Dialect("alfworld", "A", lambda t: {"game": t, "world_type": "Text"}),
        Dialect("maze", "A", lambda t: {"game": t}),
        Dialect("wordle", "A", lambda t: {"game": t}),
        Dialect("agentgym", "A", _data_idx, prompts.raw_action, create_body={}),
        # Family B: keyed by `env_idx`.
        Dialect("searchqa", "B", lambda t: {"id": t}, prompts.raw_action, create_body={"id": 0}),
        Dialect("tool", "B", lambda t: {"id": t}, prompts.raw_action, create_body={"id": 0}),
        Dialect("webshop", "B", lambda t: {"session_id": t}, ids_only_grow=False),
        Dialect("sqlgym", "B", lambda t: {"item_id": t}, ids_only_grow=False),
        Dialect("webarena", "B", lambda t: {"seed": 0, "idx": t}),
    ]
}
"""Every server variant this plugin speaks, by the name `env.env` takes in a config."""
