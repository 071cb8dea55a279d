"""Where rewards sit in a multi-turn episode, for algorithms with per-token returns.

A trajectory interleaves the tokens the agent sampled with observation tokens.
Per-token rewards, values, returns and advantages live on the agent's tokens
only, taken in order: the observation tokens between two turns are bridged
(the last token of turn k is followed directly by the first token of turn
k + 1) and never rewarded. The outcome reward sits on the last token the agent
*generated*, also when the sequence ends with observation tokens, so it always
reaches the advantages (AgentGym-RL puts it on the last token of the sequence,
a masked observation token there, and loses it).

Also here, for the group-based algorithms: `group_normalize`, the one group
baseline, and `turn_spans`, which token positions belong to which turn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

from agentgym_core.types import Trajectory

GroupStd: TypeAlias = Literal["population", "sample", "none"]
"""How `group_normalize` scales: by the std over n, over n - 1, or not at all."""


def older_scale_by_std(data: Any) -> Any:
    """A config block with `scale_by_std` (the older spelling of `std`) read as `std`.

    For a pydantic `mode="before"` validator: false becomes `std: none`, true keeps
    the default, and a `std` that contradicts it is refused.
    """
    if not isinstance(data, dict) or "scale_by_std" not in data:
        return data
    data = dict(data)
    scale = data.pop("scale_by_std")
    if not isinstance(scale, bool):
        raise ValueError(f"scale_by_std must be true or false, got {scale!r}; prefer `std`")
    if "std" in data and (data["std"] == "none") == scale:
        raise ValueError(
            f"scale_by_std: {str(scale).lower()} contradicts std: {data['std']}; "
            "give only `std` (scale_by_std is its older spelling)"
        )
    if not scale:
        data["std"] = "none"
    return data


def agent_positions(trajectory: Trajectory) -> list[int]:
    """Positions of the tokens the agent generated, in order."""
    return [i for i, m in enumerate(trajectory.loss_mask) if m]


def turn_spans(trajectory: Trajectory) -> list[tuple[int, int]]:
    """[start, end) of each turn's sampled tokens: the runs of 1s in the loss mask.

    Raises ValueError unless there is exactly one run per turn, the layout the
    rollout writes (an observation token always separates two turns).
    """
    spans, start = [], None
    for i, m in enumerate([*trajectory.loss_mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if len(spans) != trajectory.num_turns:
        raise ValueError(
            f"task {trajectory.task_id}: {len(spans)} runs of sampled tokens for "
            f"{trajectory.num_turns} turns; per-turn values need one run per turn"
        )
    return spans


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
            -kl_coef * (trajectory.behaviour[i] - trajectory.ref_logprobs[i]) for i in positions
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


def group_normalize(values: Sequence[float], *, std: GroupStd, eps: float) -> list[float]:
    """(v - mean) / (std + eps) over one group, or v - mean with `std="none"`.

    The std is an explicit choice because implementations differ and results
    depend on it: `population` divides the squared deviations by n (GRPO's
    reference code), `sample` by n - 1 (`torch.std`, as verl-agent). A lone value
    has no sample std; it gives [0.0]. Equal values may leave a rounding residue
    of the mean rather than exact zeros; callers that need exact zeros check first.
    """
    if not values:
        return []
    mean = sum(values) / len(values)
    centered = [v - mean for v in values]
    if std == "none":
        return centered
    if std not in ("population", "sample"):
        raise ValueError(f"std must be 'population', 'sample' or 'none', got {std!r}")
    divisor = len(values) - 1 if std == "sample" else len(values)
    if divisor == 0:
        return centered
    scale = math.sqrt(sum(c * c for c in centered) / divisor)
    return [c / (scale + eps) for c in centered]
