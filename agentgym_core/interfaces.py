"""The four protocols a plugin implements: Environment, Policy, Algorithm, HorizonScheduler.

Plugins register a factory for one of these under a name (see `hookspecs`);
the core only ever talks to them through these methods.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentgym_core.types import Generation, StepResult, TaskId, TrajectoryBatch

if TYPE_CHECKING:
    import torch


@runtime_checkable
class Environment(Protocol):
    """Text in, text out; one episode at a time per instance.

    Implementations may be synchronous and slow: the rollout engine runs them
    in a bounded thread pool with a timeout. An exception (or timeout) marks
    the episode `env_error`; it is never scored as a failure.
    """

    def tasks(self, split: str) -> Sequence[TaskId]:
        """Deterministic task ids of a split (`"train"` or `"test"`), disjoint across splits."""
        ...

    def instruction(self) -> str:
        """The instruction prompt that opens every conversation (rules, action syntax)."""
        ...

    def reset(self, task_id: TaskId) -> str:
        """Start the episode `task_id`; returns the first observation (goal and state)."""
        ...

    def step(self, action: str) -> StepResult:
        """Apply one action. Invalid actions get an explanatory observation, not an exception."""
        ...

    def valid_actions(self) -> list[str] | None:
        """Every action valid now, where the action set is enumerable; else None."""
        ...

    def task_group(self, task_id: TaskId) -> str:
        """A label for per-group reporting (a level name, a difficulty)."""
        ...

    def close(self) -> None:
        """Release resources (processes, browsers, sockets)."""
        ...


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn."""

    max_new_tokens: int = 32
    temperature: float = 1.0
    greedy: bool = False
    seed: int | None = None
    """Per-request seed: the same seed gives the same sample however requests are batched."""


@runtime_checkable
class Policy(Protocol):
    """Generation, token in and token out.

    The rollout engine submits one `generate` call per live episode and awaits
    it; the policy batches whatever calls are pending.
    """

    tokenizer: Any
    """A Hugging Face tokenizer with a chat template."""

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        allowed_actions: Sequence[str] | None = None,
        *,
        session: Hashable | None = None,
    ) -> Generation:
        """Sample one assistant turn after `prompt_ids`.

        With `allowed_actions`, decoding is restricted to exactly one of those
        strings followed by the end-of-turn token; `Generation.allowed` records
        the restriction at each sampled position. `session` names the episode:
        a policy may keep its KV state between turns until `release(session)`.
        """
        ...

    def release(self, session: Hashable) -> None:
        """The episode `session` ended; drop whatever was kept for it."""
        ...

    def sync_weights(self, model: Any) -> None:
        """Load the learner's weights after an update (free when shared)."""
        ...

    def close(self) -> None:
        """Stop background work."""
        ...


@dataclass
class LossInputs:
    """One micro-batch, as tensors of shape [batch, time] aligned on tokens.

    Position t holds quantities for predicting token t (the learner has already
    shifted logits). `mask` is 1 on sampled agent tokens. `normalizer` is the
    number of masked tokens in the whole mini-batch, so summing micro-batch
    losses gives the token mean over the mini-batch.
    """

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    entropy: torch.Tensor
    normalizer: float
    ref_logprobs: torch.Tensor | None = None
    values: torch.Tensor | None = None
    old_values: torch.Tensor | None = None
    returns: torch.Tensor | None = None


@dataclass(frozen=True)
class AlgorithmNeeds:
    """What an algorithm asks the trainer for."""

    online: bool = True
    """True: rollouts each step; False: an offline dataset (SFT, DPO)."""
    reference: bool = False
    """A frozen copy of the starting model for KL terms."""
    critic: bool = False
    """A value function (PPO)."""
    group_size: int = 1
    """Samples per task in one update (GRPO, RLOO need > 1)."""


@runtime_checkable
class Algorithm(Protocol):
    """From trajectories to a loss."""

    needs: AlgorithmNeeds

    def advantages(self, batch: TrajectoryBatch) -> None:
        """Set `advantages` (and `returns` if a critic is used) on each trainable trajectory.

        A trajectory left with `advantages = None` is not trained on.
        """
        ...

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        """The scalar loss of one micro-batch and metrics to log (means over its tokens)."""
        ...


@runtime_checkable
class HorizonScheduler(Protocol):
    """How many turns an episode may take at update `step`.

    Must be a pure function of its inputs so that a resumed run gets the same
    horizon at the same step.
    """

    def max_turns(self, step: int, history: Sequence[Mapping[str, float]]) -> int:
        """Turn limit for rollouts of update `step` (0-based), given past step metrics."""
        ...
