"""Decoupled PPO for stale rollouts (`trainer.max_staleness`), as in AReaL (arXiv 2505.24298).

With rollouts that ran on weights up to k updates old, three policies are in
play: the behaviour policy that sampled (its log-probabilities are on the
trajectory), the proximal policy (the learner's weights when the update
starts) and the policy being trained. Decoupled PPO clips the ratio
pi_theta / pi_proximal, as on-policy PPO does, and corrects for sampling
from the behaviour policy with the importance weight
w = pi_proximal / pi_behaviour, truncated at `importance_cap` (truncated
importance sampling: bounded variance when the two drift apart):

    loss = -w * min(r * A, clip(r, 1 - eps, 1 + eps) * A),  r = pi_theta / pi_proximal

Because w >= 0, w * min(r A, clip(r) A) = min(r (w A), clip(r) (w A)): scaling
each token's advantage by w and training on the proximal log-probabilities as
the "old" ones gives exactly this objective with every algorithm's own clipped
loss, which is how the learner applies it.

With one optimizer step per batch (`epochs: 1, mini_batches: 1`) the proximal
policy is the one the loss's own forward pass evaluates, so the learner takes
the proximal log-probabilities from that pass (`ImportanceTally`) instead of
a forward pass of its own over every trajectory first: the same objective,
one forward pass fewer per trajectory. With more steps per batch the proximal
values must be fixed before the first step, and the learner computes them
up front (`importance_weights`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


def importance_weights(
    proximal: Sequence[float],
    behaviour: Sequence[float],
    mask: Sequence[int],
    cap: float,
) -> tuple[list[float], list[float]]:
    """Per-token truncated weights min(exp(proximal - behaviour), cap), and the raw ratios.

    Tokens the policy did not sample (mask 0) get weight 0 and no raw ratio.
    """
    weights, raw = [], []
    for prox, behav, sampled in zip(proximal, behaviour, mask, strict=True):
        if not sampled:
            weights.append(0.0)
            continue
        ratio = math.exp(prox - behav)
        raw.append(ratio)
        weights.append(min(ratio, cap))
    return weights, raw


@dataclass
class ImportanceTally:
    """Behaviour weights computed inside the loss's forward pass, and their running statistics.

    `weigh` is called once per micro-batch of the update; `stats` gives the same
    statistics as a batch weighed up front. One process: rollouts ahead of the
    learner run on one rank only (`TrainStage` refuses more).
    """

    cap: float
    weight_sum: float = 0.0
    largest: float = 0.0
    truncated: int = 0
    tokens: int = 0
    diff: float = 0.0

    def weigh(
        self, proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, *, tally: bool
    ) -> torch.Tensor:
        """min(exp(proximal - behaviour), cap) where mask, else 0; counted when `tally`."""
        sampled = mask.bool()
        gap = proximal.detach().float() - behaviour.float()
        ratio = torch.exp(gap)
        weights = torch.where(sampled, ratio.clamp(max=self.cap), torch.zeros_like(ratio))
        if tally and bool(sampled.any()):
            raw = ratio[sampled]
            self.weight_sum += float(weights[sampled].sum())
            self.largest = max(self.largest, float(raw.max()))
            self.truncated += int((raw > self.cap).sum())
            self.tokens += int(sampled.sum())
            self.diff += float(gap[sampled].abs().sum())
        return weights.to(proximal.dtype)

    def stats(self) -> dict[str, float]:
        """The update's weight statistics, as `Learner` logs them."""
        tokens = max(self.tokens, 1)
        return {
            "behaviour_logprob_diff": self.diff / tokens,
            "importance_weight_mean": self.weight_sum / tokens,
            "importance_weight_max": self.largest if self.tokens else 1.0,
            "importance_truncated_fraction": self.truncated / tokens,
        }
