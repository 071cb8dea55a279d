"""The four protocols a plugin implements: Environment, Policy, Algorithm, HorizonScheduler.

Plugins register a factory for one of these under a name (see `hookspecs`);
the core only ever talks to them through these methods.

Offline algorithms (`AlgorithmNeeds.online` False: SFT, DPO) implement
`OfflineAlgorithm` instead of `Algorithm`: they build examples from an
`OfflineDataset` and compute a loss from summed sequence log-probabilities.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from agentgym_core.types import (
    AgentTrajItem,
    Generation,
    Message,
    StepResult,
    TaskId,
    Trajectory,
    TrajectoryBatch,
)

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


class PolicyExtras(Protocol):
    """What a policy may add to `Policy`, and what each changes. All are optional.

    Read with `getattr(policy, name, default)`; `tests/test_architecture.py`
    fails on a `getattr` of a policy for an attribute not declared here.
    """

    computes_as_learner: bool
    """True when the policy samples with the learner's own model and forward pass (the `hf`
    policy), so its log-probabilities differ from the learner's only by how requests were
    batched. With rollouts ahead of the learner (`trainer.max_staleness`) and
    `trainer.behaviour_logprobs: auto`, the behaviour log-probabilities are then recomputed by
    the learner's packed pass instead of taken from the sampler (`run.rollout_step`)."""

    def counters(self) -> dict[str, float]:
        """Cumulative figures, logged after every rollout as `policy/<name>`.

        Turns moved off a dead replica, restarts noticed, generation time by part.
        Changes nothing in training; a resumed run must log the same values as a
        straight one, so no per-process counts.
        """
        ...

    def stage_weights(self, model: Any) -> Any:
        """Write `model`'s weights where the samplers load them from; a handle for `sync_staged`.

        For policies whose samplers hold weights of their own (server replicas);
        `sync_weights(m)` is `sync_staged(stage_weights(m))`. With rollouts ahead
        of the learner (`trainer.max_staleness`, thread worker, behaviour log-probs
        not recomputed) the learner stages each version when it pushes it, so no
        copy of the model is kept for the rollouts (`run.sources`). Defined with
        `sync_staged`; ignored on a policy that `computes_as_learner`.
        """
        ...

    def sync_staged(self, staged: Any) -> None:
        """The samplers load weights `stage_weights` wrote (and are checked against them)."""
        ...

    def synced_weights(self) -> Any:
        """The staged handle of the weights the samplers hold now (None: their own).

        Rollouts ahead start on it rather than staging the learner's starting
        weights a second time, right after the policy's build synced them.
        """
        ...


POLICY_EXTRAS = (
    "computes_as_learner",
    "counters",
    "stage_weights",
    "sync_staged",
    "synced_weights",
)
"""The names `PolicyExtras` declares."""


@dataclass
class LossInputs:
    """One micro-batch, as tensors of shape [batch, time] aligned on tokens.

    Position t holds quantities for predicting token t (the learner has already
    shifted logits). `mask` is 1 on sampled agent tokens. `normalizer` is the
    number of masked tokens in the whole mini-batch, so summing micro-batch
    losses gives the token mean over the mini-batch.
    """

    logprobs: torch.Tensor
    """The policy's log-probabilities, with gradient."""
    old_logprobs: torch.Tensor
    """What the ratio is taken against: chosen per update by the learner's off-policy
    correction (the loss pass's own values, detached, with one optimizer step a batch; the
    learner's values before the first step otherwise), never the trajectory's raw field."""
    advantages: torch.Tensor
    """The algorithm's advantages; with stale rollouts already scaled by each token's
    behaviour weight (decoupled PPO), so the algorithm's own clipped loss applies as is."""
    mask: torch.Tensor
    entropy: torch.Tensor
    normalizer: float
    ref_logprobs: torch.Tensor | None = None
    """Frozen reference's log-probabilities (None unless `needs.reference`)."""
    values: torch.Tensor | None = None
    """Critic's values, with gradient (None unless `needs.critic`)."""
    old_values: torch.Tensor | None = None
    """Critic's values at rollout time (`Trajectory.values`), for value clipping."""
    returns: torch.Tensor | None = None
    """Value targets the algorithm set (`Trajectory.returns`)."""


@dataclass(frozen=True)
class CriticSpec:
    """The value function an algorithm asks for, and how the trainer trains it."""

    separate: bool = False
    """False: a linear value head on the policy's last hidden state (shares its body).
    True: a separate critic model (its own transformer body) with a value head."""
    path: str | None = None
    """Weights of the separate critic's body; None: the stage's starting model."""
    lr: float | None = None
    """Peak learning rate of the critic's own optimizer; None: the trainer's `lr`."""
    warmup_updates: int = 0
    """The first N updates train only the critic; the policy's weights stay as they are."""


@dataclass(frozen=True)
class AlgorithmNeeds:
    """What an algorithm asks the trainer for."""

    online: bool = True
    """True: rollouts each step; False: an offline dataset (SFT, DPO)."""
    reference: bool = False
    """A frozen copy of the starting model for KL terms. Its per-token log-probabilities
    are on `Trajectory.ref_logprobs` when `advantages` runs, and in `LossInputs.ref_logprobs`."""
    critic: CriticSpec | None = None
    """A value function (PPO); None: none. Its per-token values at rollout time are on
    `Trajectory.values` when `advantages` runs; `LossInputs.values` has them with gradient."""
    group_size: int = 1
    """Samples per task in one update (GRPO, RLOO need > 1)."""
    entropy_grad: bool = True
    """True: the loss differentiates `LossInputs.entropy` (an entropy bonus). False: the
    entropy is only logged, and the learner computes it without autograd (cheaper)."""


@runtime_checkable
class Algorithm(Protocol):
    """From trajectories to a loss."""

    needs: AlgorithmNeeds

    def advantages(self, batch: TrajectoryBatch) -> None:
        """Set `advantages` (and `returns` if a critic is used) on each trainable trajectory.

        `ref_logprobs` and `values` are already set where `needs` asked for them.
        A trajectory left with `advantages = None` is not trained on.
        """
        ...

    def loss(self, inputs: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
        """The scalar loss of one micro-batch and metrics to log (means over its tokens)."""
        ...


# -- offline algorithms (needs.online = False): SFT, DPO -------------------------------


@dataclass
class SequenceInputs:
    """One micro-batch of whole examples, each a fixed number of token sequences.

    An example is one sequence for SFT and two (chosen, rejected) for DPO.
    Tensors have shape [examples, sequences_per_example]. `logprobs` is each
    sequence's log-probability summed over its agent tokens (loss mask 1),
    with gradient; `ref_logprobs` the same under the frozen reference. The
    totals cover the whole mini-batch (one optimizer step), so a loss divided
    by them sums over micro-batches to the mini-batch mean.
    """

    logprobs: torch.Tensor
    tokens: torch.Tensor
    """Agent tokens per sequence (float)."""
    total_examples: int
    total_tokens: float
    ref_logprobs: torch.Tensor | None = None


@runtime_checkable
class OfflineDataset(Protocol):
    """What the core offers an offline algorithm for building its examples."""

    seed: int

    def files(self, patterns: Sequence[str], key: str) -> list[Path]:
        """Files matching paths or globs; the error names the option `key` and the pattern."""
        ...

    def sequence(self, messages: Sequence[Message], *, task_id: int = -1) -> Trajectory:
        """A conversation tokenized exactly as a rollout of it (ids and loss mask)."""
        ...

    def expert_items(
        self,
        *,
        episodes: int,
        split: str,
        max_turns: int,
        env_options: Mapping[str, Any],
        key: str,
        workers: int = 1,
    ) -> list[AgentTrajItem]:
        """Successful episodes of the env's expert on the first `episodes` tasks of `split`.

        `env_options` are merged over the stage's `env` block and validated by
        the env's model; errors name `key`. `workers` processes share the tasks,
        each with its own env; the items are the same, in the same order.
        """
        ...

    def takeover_items(
        self,
        *,
        episodes: int,
        split: str,
        roll_in_turns: int,
        max_turns: int,
        env_options: Mapping[str, Any],
        key: str,
        workers: int = 1,
    ) -> list[AgentTrajItem]:
        """DAgger-style items: the stage's starting model plays, the env's expert takes over.

        The model plays the first `episodes` tasks of `split` (at most `roll_in_turns`
        turns each); each episode is cut at a seeded turn, replayed, and finished by the
        expert. Kept: won takeovers, the model's turns as context (`loss: false`).
        """
        ...

    def relabelled(
        self, items: Sequence[AgentTrajItem], copies: int, key: str
    ) -> list[AgentTrajItem]:
        """`copies` copies of each item with the env's interchangeable words permuted.

        Seeded; an env that names no such words (`interchangeable_words()`) is an error
        naming `key`.
        """
        ...

    def stage_rollouts(self, stage: str, key: str) -> list[Trajectory]:
        """Every trajectory an earlier pipeline stage saved (`tracking.save_rollouts`)."""
        ...

    def rollout_files(self, patterns: Sequence[str], key: str) -> list[Trajectory]:
        """Trajectories saved as JSONL (`tracking.save_rollouts`, an evolve round's kept ones)."""
        ...


@runtime_checkable
class OfflineAlgorithm(Protocol):
    """An algorithm trained on a fixed dataset of examples (SFT, DPO).

    The trainer builds the examples once per stage, takes `batch_size`
    examples per optimizer step in a seeded order (a pure function of the
    step, so a resumed run sees the same batches), and asks for the loss of
    each micro-batch from summed sequence log-probabilities.
    """

    needs: AlgorithmNeeds
    sequences_per_example: int
    batch_size: int

    def examples(self, data: OfflineDataset) -> list[tuple[Trajectory, ...]]:
        """The training examples, each `sequences_per_example` token sequences."""
        ...

    def source_stages(self) -> dict[str, str]:
        """Option key -> name of an earlier stage whose saved rollouts `examples` reads."""
        ...

    def sequence_loss(self, inputs: SequenceInputs) -> tuple[torch.Tensor, dict[str, float]]:
        """The scalar loss of one micro-batch and metrics to log (means over its examples)."""
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
