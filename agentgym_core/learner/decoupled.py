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
"""

from __future__ import annotations

import math
from collections.abc import Sequence


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
