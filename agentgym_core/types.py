"""Plain data passed between environments, policies, algorithms and the learner.

Everything here is a dataclass of Python values so it crosses process and
HTTP boundaries as JSON without custom encoders; the few functions at the end
are list helpers over them. Nothing here imports the rest of agentgym.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TypeVar

TaskId = int
"""Task ids are integers, as AgentGym's `data_idx`: deterministic per split."""


class Termination(enum.StrEnum):
    """Why an episode ended. Every trajectory carries exactly one."""

    DONE = "done"
    """The environment said the episode is over (success or failure)."""
    HORIZON = "horizon"
    """The scheduler's turn limit cut the episode; it keeps the env's reward."""
    CONTEXT_BUDGET = "context_budget"
    """The next observation would not fit in the model's context budget."""
    ENV_ERROR = "env_error"
    """Infrastructure failed (exception or timeout): excluded from updates."""


@dataclass(frozen=True)
class StepResult:
    """What `Environment.step` returns."""

    observation: str
    reward: float
    done: bool
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Generation:
    """One sampled assistant turn, token in and token out.

    `allowed[i]` is the set of token ids the sampler was restricted to when it
    drew `token_ids[i]` (None when unconstrained), so the learner can apply the
    same restriction when it recomputes log-probabilities.
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    allowed: list[tuple[int, ...] | None] | None = None
    finished: bool = True
    """False when generation stopped at `max_new_tokens` without an end token."""


@dataclass
class Turn:
    """One agent action and what the environment answered."""

    action: str
    observation: str
    reward: float
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    allowed: list[str] | None = None
    """The actions decoding was constrained to at this turn (None: free text)."""
    logprob: float | None = None
    """Log-probability of the whole action under the sampler (None: a text-level policy)."""


@dataclass
class Trajectory:
    """A whole episode as the learner sees it: one token sequence plus masks.

    `token_ids` is the prompt, then alternating sampled actions and observation
    deltas. `loss_mask[i]` is 1 exactly where `token_ids[i]` was sampled by the
    policy, 0 elsewhere; `logprobs[i]` is the sampling log-probability there (0
    elsewhere). An offline example may instead weigh the other tokens by a value
    in (0, 1] (`sft.observation_loss`): the learner multiplies each token's
    log-probability by its `loss_mask` value.
    `constraints` maps a token position to the token ids the sampler allowed.
    """

    task_id: TaskId
    group: int
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    constraints: dict[int, tuple[int, ...]] = field(default_factory=dict)
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    success: bool = False
    termination: Termination = Termination.DONE
    error: str | None = None
    error_trace: str | None = None
    """With `error`: the innermost frames of its traceback and its last line, at most
    ~20 lines and 4 KB (of a call that timed out: where it still ran); None otherwise."""
    prompt_length: int = 0
    task_group: str = ""
    """A label for per-group reports (a BabyAI level, a crafting depth)."""
    advantages: list[float] | None = None
    """Per-token advantages, set by the algorithm (0 where loss_mask is 0)."""
    first_observation: str = ""
    """What the env showed at reset, before the first action (it is in the prompt's tokens)."""
    frames: list[str] | None = None
    """With `tracking.frames`: what the env's `render()` showed at reset and after each turn
    (`frames[i + 1]` after `turns[i]`), as PNG data URIs or text; None when not recorded."""
    returns: list[float] | None = None
    """Per-token value targets, for algorithms with a critic."""
    ref_logprobs: list[float] | None = None
    """Per-token log-probabilities under the frozen reference (0 where loss_mask is 0).

    Set by the learner before `Algorithm.advantages` when the algorithm needs a
    reference, so KL penalties can be folded into rewards.
    """
    values: list[float] | None = None
    """Per-token critic values V(state before token i) at rollout time (0 where loss_mask is 0).

    Set by the learner before `Algorithm.advantages` when the algorithm needs a critic.
    """
    behaviour_logprobs: list[float] | None = None
    """Per-token log-probabilities of the sampling weights as the learner computes them, when
    the trainer recomputes them for stale rollouts (`trainer.behaviour_logprobs`); None: the
    sampler's `logprobs` stand for them. `logprobs` stays as sampled either way."""

    @property
    def behaviour(self) -> list[float]:
        """The behaviour policy's log-probabilities the learner weighs and penalizes against."""
        return self.logprobs if self.behaviour_logprobs is None else self.behaviour_logprobs

    @property
    def num_turns(self) -> int:
        """Number of actions the agent took."""
        return len(self.turns)

    @property
    def num_sampled_tokens(self) -> int:
        """Number of tokens the policy generated."""
        return sum(self.loss_mask)

    @property
    def last_sampled_index(self) -> int:
        """Position of the last token the agent generated (-1 if none).

        Outcome rewards are placed here, never on a trailing observation token.
        """
        for i in range(len(self.loss_mask) - 1, -1, -1):
            if self.loss_mask[i]:
                return i
        return -1

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (constraint keys become strings)."""
        data = asdict(self)
        data["termination"] = str(self.termination)
        data["constraints"] = {str(k): list(v) for k, v in self.constraints.items()}
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        """Inverse of `to_dict`."""
        data = dict(data)
        data["termination"] = Termination(data["termination"])
        data["constraints"] = {int(k): tuple(v) for k, v in data.get("constraints", {}).items()}
        data["turns"] = [Turn(**t) for t in data.get("turns", [])]
        return cls(**data)


@dataclass
class TrajectoryBatch:
    """The trajectories of one update, grouped by task (`group` ids)."""

    trajectories: list[Trajectory]

    def __iter__(self) -> Iterator[Trajectory]:
        return iter(self.trajectories)

    def __len__(self) -> int:
        return len(self.trajectories)

    @property
    def trainable(self) -> list[Trajectory]:
        """Trajectories that may enter the update: env errors are excluded."""
        return [
            t
            for t in self.trajectories
            if t.termination != Termination.ENV_ERROR and t.num_sampled_tokens > 0
        ]

    def groups(self) -> dict[int, list[Trajectory]]:
        """Trainable trajectories keyed by group id, in insertion order."""
        out: dict[int, list[Trajectory]] = {}
        for t in self.trainable:
            out.setdefault(t.group, []).append(t)
        return out


# -- AgentTraj: AgentGym's conversation format (read and written by `data.agenttraj`) ------

Role = Literal["human", "gpt"]


@dataclass(frozen=True)
class Message:
    """One turn of an AgentTraj conversation (not a chat API's message)."""

    role: Role
    """`human` (instruction, observations) or `gpt` (the agent)."""
    value: str
    loss: bool | None = None
    """For `gpt` turns: True or None trains on it, False keeps it as context only."""

    @property
    def trains(self) -> bool:
        """Whether this turn's tokens carry loss."""
        return self.role == "gpt" and self.loss is not False

    def to_dict(self) -> dict[str, Any]:
        """The AgentTraj JSON object of this turn."""
        return {"from": self.role, "loss": self.loss, "value": self.value}


@dataclass
class AgentTrajItem:
    """One conversation with its item id (`"<env>_<task>"`) and any extra fields kept as read."""

    item_id: str
    conversations: list[Message]
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def task_id(self) -> int | None:
        """The task number at the end of the item id (`babyai_12` -> 12), if any."""
        return task_number(self.item_id)

    def to_dict(self) -> dict[str, Any]:
        """The AgentTraj JSON object of this item."""
        return {
            "item_id": self.item_id,
            "conversations": [m.to_dict() for m in self.conversations],
            **self.extra,
        }


def task_number(item_id: str) -> int | None:
    """`babyai_12` -> 12; None when the id does not end in `_<int>`."""
    match = re.search(r"_(\d+)$", item_id)
    return int(match.group(1)) if match else None


# -- list helpers ---------------------------------------------------------------------

T = TypeVar("T")


def mean(values: Sequence[float]) -> float:
    """Mean of a possibly empty sequence (0.0 when empty)."""
    return float(sum(values) / len(values)) if values else 0.0


def round_robin(items: Sequence[T], count: int) -> list[T]:
    """Up to `count` items (each with a `.group`), one per group in turn: distinct tasks first.

    The tracker logs these episodes, and the rollout engine draws frames for
    the same ones, so the episodes a person opens are the ones with frames.
    """
    by_group: dict[Any, list[T]] = {}
    for item in items:
        by_group.setdefault(item.group, []).append(item)  # type: ignore[attr-defined]
    chosen: list[T] = []
    depth = 0
    while len(chosen) < min(count, len(items)):
        chosen.extend(g[depth] for g in by_group.values() if depth < len(g))
        depth += 1
    return chosen[:count]
