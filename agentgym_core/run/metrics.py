"""Rollout metrics of one step."""

from __future__ import annotations

from agentgym_core.types import Termination, TrajectoryBatch, mean


def rollout_metrics(batch: TrajectoryBatch, *, horizon: int, seconds: float) -> dict[str, float]:
    """Success, reward, turns and termination counts; env errors are counted, not scored."""
    scored = [t for t in batch if t.termination != Termination.ENV_ERROR]
    generated = sum(t.num_sampled_tokens for t in batch)
    metrics = {
        "rollout/success_rate": mean([float(t.success) for t in scored]),
        "rollout/reward_mean": mean([t.reward for t in scored]),
        "rollout/turns_mean": mean([float(t.num_turns) for t in scored]),
        "rollout/horizon": float(horizon),
        "rollout/env_errors": float(len(batch) - len(scored)),
        "rollout/episodes": float(len(batch)),
        "rollout/generated_tokens": float(generated),
        "rollout/tokens_per_s": generated / seconds if seconds > 0 else 0.0,
        "rollout/seconds": seconds,
    }
    for group in sorted({t.task_group for t in scored if t.task_group}):
        members = [t for t in scored if t.task_group == group]
        metrics[f"rollout/group/{group}/success_rate"] = mean([float(t.success) for t in members])
    for reason in Termination:
        count = sum(t.termination == reason for t in batch)
        metrics[f"rollout/termination/{reason}"] = float(count)
    return metrics
