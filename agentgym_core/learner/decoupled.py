"""Behaviour weights of decoupled PPO for stale rollouts (`trainer.max_staleness`).

With rollouts that ran on weights up to k updates old, three policies are in
play: the behaviour policy that sampled (its log-probabilities are on the
trajectory), the proximal policy (the learner's weights when the update
starts) and the policy being trained. Decoupled PPO (Hilton et al., arXiv
2110.00641; used for asynchronous RL by AReaL, arXiv 2505.24298) clips the
ratio pi_theta / pi_proximal, as on-policy PPO does, and corrects for sampling
from the behaviour policy with the importance weight
w = pi_proximal / pi_behaviour:

    loss = -w * min(r * A, clip(r, 1 - eps, 1 + eps) * A),  r = pi_theta / pi_proximal

Two ways to bound w when the policies drift apart (`trainer.importance_mode`):
`truncate` caps it at `importance_cap` (truncated importance sampling, as in
IMPALA's V-trace and verl's TIS): a token keeps some weight; `mask` drops the
tokens whose weight exceeds the cap (weight 0), as AReaL does: the tokens kept
are unbiased. A cap below 1 would shrink even tokens the proximal policy likes
better, so the config refuses it.

Because w >= 0, w * min(r A, clip(r) A) = min(r (w A), clip(r) (w A)): scaling
each token's advantage by w and training on the proximal log-probabilities as
the "old" ones gives exactly this objective with every algorithm's own clipped
loss, which is how the learner applies it (`offpolicy`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

ImportanceMode = Literal["truncate", "mask"]


def importance_weights(
    proximal: Sequence[float],
    behaviour: Sequence[float],
    mask: Sequence[int],
    cap: float,
    mode: ImportanceMode = "truncate",
) -> tuple[list[float], list[float]]:
    """Per-token bounded weights of exp(proximal - behaviour), and the raw ratios.

    `truncate`: min(ratio, cap); `mask`: the ratio, or 0 where it exceeds `cap`.
    Tokens the policy did not sample (mask 0) get weight 0 and no raw ratio.
    """
    weights, raw = [], []
    for prox, behav, sampled in zip(proximal, behaviour, mask, strict=True):
        if not sampled:
            weights.append(0.0)
            continue
        ratio = math.exp(prox - behav)
        raw.append(ratio)
        weights.append(min(ratio, cap) if mode == "truncate" else (ratio if ratio <= cap else 0.0))
    return weights, raw


@dataclass
class BehaviourWeights:
    """Computes the weights of an update's micro-batches and keeps their running statistics.

    `weigh` runs once per micro-batch (or trajectory); `stats` sums them up. One
    process: rollouts ahead of the learner run on one rank only (the train stage
    refuses more), so nothing is reduced across ranks.
    """

    cap: float
    mode: ImportanceMode = "truncate"
    weight_sum: float = 0.0
    largest: float = 0.0
    dropped: int = 0
    tokens: int = 0
    diff: float = 0.0

    def weigh(
        self, proximal: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, *, tally: bool
    ) -> torch.Tensor:
        """The bounded weights where `mask`, else 0, in `proximal`'s dtype; counted when `tally`."""
        sampled = mask.bool()
        gap = proximal.detach().float() - behaviour.float()
        ratio = torch.exp(gap)
        over = ratio > self.cap
        bounded = (
            ratio.clamp(max=self.cap) if self.mode == "truncate" else ratio.masked_fill(over, 0)
        )
        weights = torch.where(sampled, bounded, torch.zeros_like(ratio))
        if tally and bool(sampled.any()):
            self.weight_sum += float(weights[sampled].sum())
            self.largest = max(self.largest, float(ratio[sampled].max()))
            self.dropped += int(over[sampled].sum())
            self.tokens += int(sampled.sum())
            self.diff += float(gap[sampled].abs().sum())
        return weights.to(proximal.dtype)

    def stats(self) -> dict[str, float]:
        """Mean |proximal - behaviour| (`sampler_logprob_diff`) and the weights' statistics.

        The share of tokens over the cap is `importance_truncated_fraction`
        (truncate) or `importance_masked_fraction` (mask).
        """
        tokens = max(self.tokens, 1)
        over = "truncated" if self.mode == "truncate" else "masked"
        return {
            "sampler_logprob_diff": self.diff / tokens,
            "importance_weight_mean": self.weight_sum / tokens,
            "importance_weight_max": self.largest if self.tokens else 1.0,
            f"importance_{over}_fraction": self.dropped / tokens,
        }
