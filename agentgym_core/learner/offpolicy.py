"""Off-policy corrections: which "old" log-probabilities and weighted advantages the loss uses.

The rollout's trajectories keep the sampler's log-probabilities as recorded.
What the loss compares against is chosen here, one strategy per update, and
travels beside the batch as tensors (`MicroBatch.columns`), never written back
onto a trajectory:

- `OnPolicy` (synchronous, one optimizer step a batch): old = the loss pass's
  own log-probabilities, detached; no weights.
- `Recomputed` (synchronous, several steps a batch): old = the learner's,
  computed up front; no weights.
- `DecoupledInPass` (stale rollouts, one step a batch): old = the loss pass's,
  detached; behaviour weights from that pass.
- `DecoupledUpFront` (stale rollouts, several steps, or a model with dropout):
  old and behaviour weights computed up front.

One optimizer step per batch is exactly on-policy: the ratio's value is 1 and
its gradient that of log pi, and the learner's own values keep the update a
deterministic function of the sampled tokens (the sampler's vary in the last
bits with how requests were batched; they are only compared, as
`sampler_logprob_diff`). Several steps need "old" values fixed before the
first, computed in eval mode as the sampler ran. Decoupled PPO's behaviour
weights (`decoupled`) come from the loss's own forward pass when that pass is
the proximal policy (one step, no dropout); a model with active dropout would
get noisy weights from a train-mode pass, so it is weighed up front in eval mode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from agentgym_core import distributed
from agentgym_core.learner.decoupled import (
    BehaviourWeights,
    ImportanceMode,
    importance_weights,
)
from agentgym_core.learner.packing import MicroBatch
from agentgym_core.types import Trajectory

Columns = dict[str, list[list[float]]]
"""Name -> one per-token list per trajectory, packed beside the batch (`pack(columns=...)`)."""

Proximal = Callable[[Sequence[Trajectory]], list[tuple[list[float], float, int]]]
"""The learner's eval-mode log-probabilities of each trajectory, with (summed |diff| to the
sampler's, agent tokens); every rank gets all of them."""


@dataclass(frozen=True)
class OffPolicySettings:
    """How stale rollouts are corrected (from the `trainer` block)."""

    max_staleness: int = 0
    """0: every batch was sampled by the weights being trained (no behaviour weights)."""
    importance_cap: float = 2.0
    importance_mode: ImportanceMode = "truncate"


class Correction(Protocol):
    """One update's off-policy correction, made fresh for each update (its tallies are its own)."""

    def prepare(self, trajectories: Sequence[Trajectory], proximal: Proximal) -> Columns:
        """Before the first optimizer step: per-token values to pack beside the batch."""
        ...

    def apply(
        self, logprobs: torch.Tensor, batch: MicroBatch, *, real: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The old log-probabilities and the advantages the loss uses, for one micro-batch.

        `logprobs` is the loss pass's own (with gradient); `real` is False for a
        stand-in micro-batch that only pairs collectives across ranks. Stale
        batches get their advantages scaled by the behaviour weights.
        """
        ...

    def stats(self) -> dict[str, float]:
        """The update's metrics (`sampler_logprob_diff`, weight statistics); may be a collective."""
        ...


@dataclass
class OnPolicy:
    """One step a batch, synchronous: the loss pass's own values are the old ones."""

    diff: float = 0.0
    tokens: int = 0

    def prepare(self, trajectories: Sequence[Trajectory], proximal: Proximal) -> Columns:
        """Nothing to fix up front."""
        return {}

    def apply(
        self, logprobs: torch.Tensor, batch: MicroBatch, *, real: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The detached log-probabilities; the sampler's are only compared."""
        old = logprobs.detach()
        if real:
            mask = batch.mask.to(old.device)
            self.diff += float(((old - batch.sampler_logprobs.to(old.device)).abs() * mask).sum())
            self.tokens += int(mask.sum())
        return old, batch.advantages.to(old.device)

    def stats(self) -> dict[str, float]:
        """Mean |learner - sampler| over every rank's agent tokens (a collective)."""
        seen = distributed.sum_over_ranks({"diff": self.diff, "tokens": self.tokens})
        return {"sampler_logprob_diff": seen["diff"] / max(seen["tokens"], 1)}


@dataclass
class Recomputed:
    """Several steps a batch, synchronous: the learner's eval-mode values, fixed up front."""

    drift: float = 0.0

    def prepare(self, trajectories: Sequence[Trajectory], proximal: Proximal) -> Columns:
        """The learner's log-probabilities of every trajectory, as the `old_logprobs` column."""
        results = proximal(trajectories)
        self.drift = sum(r[1] for r in results) / max(sum(r[2] for r in results), 1)
        return {"old_logprobs": [r[0] for r in results]}

    def apply(
        self, logprobs: torch.Tensor, batch: MicroBatch, *, real: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed values."""
        device = logprobs.device
        return batch.columns["old_logprobs"].to(device), batch.advantages.to(device)

    def stats(self) -> dict[str, float]:
        """Mean |learner - sampler| of the up-front pass."""
        return {"sampler_logprob_diff": self.drift}


@dataclass
class DecoupledInPass:
    """Stale rollouts, one step a batch: the loss pass is the proximal policy; weights from it."""

    weights: BehaviourWeights

    def prepare(self, trajectories: Sequence[Trajectory], proximal: Proximal) -> Columns:
        """Nothing to fix up front."""
        return {}

    def apply(
        self, logprobs: torch.Tensor, batch: MicroBatch, *, real: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The detached values as proximal, and the behaviour weights against the sampler's."""
        old = logprobs.detach()
        device = old.device
        behaviour, mask = batch.behaviour_logprobs.to(device), batch.mask.to(device)
        weights = self.weights.weigh(old, behaviour, mask, tally=real)
        return old, batch.advantages.to(device) * weights

    def stats(self) -> dict[str, float]:
        """The weights' statistics."""
        return self.weights.stats()


@dataclass
class DecoupledUpFront:
    """Stale rollouts, several steps a batch (or dropout): proximal values and weights up front.

    Weights and weighted advantages are computed in float64, one trajectory at
    a time, before they are packed.
    """

    cap: float
    mode: ImportanceMode = "truncate"
    _stats: dict[str, float] | None = None

    def prepare(self, trajectories: Sequence[Trajectory], proximal: Proximal) -> Columns:
        """The proximal log-probabilities, and the advantages scaled by each token's weight."""
        results = proximal(trajectories)
        old, advantages, raw_all = [], [], []
        for trajectory, (values, _, _) in zip(trajectories, results, strict=True):
            weights, raw = importance_weights(
                values, trajectory.behaviour, trajectory.loss_mask, self.cap, self.mode
            )
            old.append(values)
            advantages.append(
                [a * w for a, w in zip(trajectory.advantages or [], weights, strict=True)]
            )
            raw_all += raw
        tokens = max(len(raw_all), 1)
        over = "truncated" if self.mode == "truncate" else "masked"
        truncate = self.mode == "truncate"
        kept = (min(r, self.cap) if truncate else (r if r <= self.cap else 0.0) for r in raw_all)
        self._stats = {
            "sampler_logprob_diff": sum(r[1] for r in results) / max(sum(r[2] for r in results), 1),
            "importance_weight_mean": sum(kept) / tokens,
            "importance_weight_max": max(raw_all, default=1.0),
            f"importance_{over}_fraction": sum(r > self.cap for r in raw_all) / tokens,
        }
        return {"old_logprobs": old, "weighted_advantages": advantages}

    def apply(
        self, logprobs: torch.Tensor, batch: MicroBatch, *, real: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed values."""
        device = logprobs.device
        old, advantages = batch.columns["old_logprobs"], batch.columns["weighted_advantages"]
        return old.to(device), advantages.to(device)

    def stats(self) -> dict[str, float]:
        """The weights' statistics, as `BehaviourWeights.stats` words them."""
        return dict(self._stats or {})


def active_dropout(model: torch.nn.Module) -> bool:
    """Whether a train-mode forward pass of `model` is random (dropout layers or config rates)."""
    if any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    rates = ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop")
    return any(float(getattr(config, name, 0.0) or 0.0) > 0 for name in rates)


def correction_for(settings: OffPolicySettings, *, steps: int, dropout: bool) -> Correction:
    """A fresh correction for one update of `steps` optimizer steps."""
    if not settings.max_staleness:
        return OnPolicy() if steps == 1 else Recomputed()
    if steps == 1 and not dropout:
        return DecoupledInPass(BehaviourWeights(settings.importance_cap, settings.importance_mode))
    return DecoupledUpFront(settings.importance_cap, settings.importance_mode)
