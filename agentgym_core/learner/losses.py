"""Loss pieces shared by the policy-gradient algorithms.

All functions take per-token tensors and a 0/1 `mask` of agent tokens, and
return sums divided by `normalizer` (the agent-token count of the whole
mini-batch), so the micro-batch losses add up to a token mean.
"""

from __future__ import annotations

from typing import Any

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask` is 1 (0 when the mask is empty)."""
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    normalizer: float,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate, -min(r A, clip(r, 1-lo, 1+hi) A), summed / normalizer.

    `clip_high` defaults to `clip_low` (symmetric); a larger value is DAPO's clip-higher.
    """
    high = clip_low if clip_high is None else clip_high
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    loss = (per_token * mask).sum() / normalizer
    with torch.no_grad():
        clip_fraction = masked_mean((clipped < unclipped).float(), mask)
        ratio_mean = masked_mean(ratio, mask)
    return loss, {"clip_fraction": float(clip_fraction), "ratio": float(ratio_mean)}


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token low-variance KL(policy || reference) estimator: exp(d) - d - 1, d = ref - logp."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


def kl_penalty(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    mask: torch.Tensor,
    normalizer: float,
    coef: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Coef * k3 KL summed / normalizer; zero (and no metric cost) without a reference."""
    if ref_logprobs is None or coef == 0.0:
        return logprobs.new_zeros(()), {}
    per_token = kl_k3(logprobs, ref_logprobs)
    loss = coef * (per_token * mask).sum() / normalizer
    return loss, {"kl": float(masked_mean(per_token.detach(), mask))}


def entropy_bonus(
    entropy: torch.Tensor, mask: torch.Tensor, normalizer: float, coef: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """-coef * entropy summed / normalizer (a bonus: lowers the loss when entropy is high)."""
    metric = {"entropy": float(masked_mean(entropy.detach(), mask))}
    if coef == 0.0:
        return entropy.new_zeros(()), metric
    return -coef * (entropy * mask).sum() / normalizer, metric


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    normalizer: float,
    *,
    clip: float | None = 0.2,
) -> tuple[torch.Tensor, dict[str, float]]:
    """0.5 * max((V - R)^2, (V_clip - R)^2) summed / normalizer, V_clip = V_old + clip(V - V_old).

    PPO's value clipping keeps the critic within `clip` of its rollout-time
    values per update, as the policy ratio clip does for the policy; None: plain MSE.
    """
    unclipped = (values - returns) ** 2
    if clip is None:
        per_token = unclipped
        clip_fraction = torch.zeros(())
    else:
        clipped_values = old_values + torch.clamp(values - old_values, -clip, clip)
        clipped = (clipped_values - returns) ** 2
        per_token = torch.maximum(unclipped, clipped)
        clip_fraction = masked_mean((clipped > unclipped).float().detach(), mask)
    loss = 0.5 * (per_token * mask).sum() / normalizer
    with torch.no_grad():
        metrics = {
            "value_loss": float(0.5 * masked_mean(per_token, mask)),
            "value_clip_fraction": float(clip_fraction),
            "value_mean": float(masked_mean(values, mask)),
        }
    return loss, metrics


def clipped_loss_with_kl_and_entropy(
    inputs: Any,
    *,
    clip_low: float,
    clip_high: float | None,
    kl_coef: float,
    entropy_coef: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped policy loss + kl_coef * KL(ref) - entropy_coef * entropy of a `LossInputs`.

    The whole policy loss of every clipped-loss algorithm: they differ in how they
    set the advantages, and in whether the KL acts here (GRPO, GiGPO) or through
    the reward (PPO, RLOO, REINFORCE++: kl_coef=0 here).
    """
    policy, metrics = clipped_policy_loss(
        inputs.logprobs,
        inputs.old_logprobs,
        inputs.advantages,
        inputs.mask,
        inputs.normalizer,
        clip_low=clip_low,
        clip_high=clip_high,
    )
    kl, kl_metrics = kl_penalty(
        inputs.logprobs, inputs.ref_logprobs, inputs.mask, inputs.normalizer, kl_coef
    )
    bonus, entropy_metrics = entropy_bonus(
        inputs.entropy, inputs.mask, inputs.normalizer, entropy_coef
    )
    return policy + kl + bonus, {**metrics, **kl_metrics, **entropy_metrics}
