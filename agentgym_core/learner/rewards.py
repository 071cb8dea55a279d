"""Where rewards sit in a multi-turn episode, for algorithms with per-token returns.

A trajectory interleaves the tokens the agent sampled with observation tokens.
Per-token rewards, values, returns and advantages live on the agent's tokens
only, taken in order: the observation tokens between two turns are bridged
(the last token of turn k is followed directly by the first token of turn
k + 1) and never rewarded. The outcome reward sits on the last token the agent
*generated*, also when the sequence ends with observation tokens, so it always
reaches the advantages (AgentGym-RL puts it on the last token of the sequence,
a masked observation token there, and loses it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from agentgym_core.types import Trajectory


def agent_positions(trajectory: Trajectory) -> list[int]:
    """Positions of the tokens the agent generated, in order."""
    return [i for i, m in enumerate(trajectory.loss_mask) if m]


def token_rewards(trajectory: Trajectory, *, outcome: float, kl_coef: float = 0.0) -> list[float]:
    """One reward per agent token: -kl_coef * (logp - ref_logp), plus `outcome` on the last.

    The KL term is the k1 estimate log(pi_old / pi_ref) of the sampled token,
    as in InstructGPT's and REINFORCE++'s per-token penalty.
    """
    positions = agent_positions(trajectory)
    if not positions:
        return []
    rewards = [0.0] * len(positions)
    if kl_coef:
        if trajectory.ref_logprobs is None:
            raise ValueError(
                "a KL penalty in the reward needs Trajectory.ref_logprobs: the algorithm must "
                "ask for a reference (AlgorithmNeeds.reference) so the learner sets them"
            )
        rewards = [
            -kl_coef * (trajectory.logprobs[i] - trajectory.ref_logprobs[i]) for i in positions
        ]
    rewards[-1] += outcome
    return rewards


def agent_values(trajectory: Trajectory) -> list[float]:
    """The critic's rollout-time value of each agent token (`Trajectory.values`)."""
    if trajectory.values is None:
        raise ValueError(
            "Trajectory.values is not set: the algorithm must ask for a critic "
            "(AlgorithmNeeds.critic) so the learner scores the batch before `advantages`"
        )
    return [trajectory.values[i] for i in agent_positions(trajectory)]


def spread(trajectory: Trajectory, per_agent_token: Sequence[float]) -> list[float]:
    """One value per agent token -> a per-token list, 0 on prompt and observation tokens."""
    full = [0.0] * len(trajectory.token_ids)
    positions = agent_positions(trajectory)
    if len(positions) != len(per_agent_token):
        raise ValueError(f"{len(per_agent_token)} values for {len(positions)} agent tokens")
    for i, value in zip(positions, per_agent_token, strict=True):
        full[i] = float(value)
    return full


def whiten(trajectories: Sequence[Trajectory], *, eps: float = 1e-8) -> None:
    """Normalize advantages over every agent token of `trajectories` together.

    (A - mean) / (std + eps) with the population std: a batch-wide baseline and
    scale, as PPO's advantage normalization and REINFORCE++ use.
    """
    chosen = [t for t in trajectories if t.advantages is not None]
    values = [t.advantages[i] for t in chosen for i in agent_positions(t)]
    if not values:
        return
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    for t in chosen:
        t.advantages = [
            (a - mean) / (std + eps) if m else 0.0
            for a, m in zip(t.advantages, t.loss_mask, strict=True)
        ]
