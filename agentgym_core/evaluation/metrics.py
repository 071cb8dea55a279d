"""Evaluation metrics over trajectories, grouped by task.

Conventions shared by every function here:

- A *task* is a `task_id`; its *samples* are the trajectories with that id.
- Trajectories that ended in `Termination.ENV_ERROR` are infrastructure
  failures, not agent failures: they are dropped before any rate is computed
  and only counted (`env_errors`). A task whose samples all failed this way
  has no samples and is left out of the per-task averages. A result with env
  errors is partial: every rate is over `episodes` of `episodes + env_errors`,
  and whoever shows one says so (`measured`).
- A sample *succeeds* when `Trajectory.success` is true.
- Empty inputs give 0.0, never an error.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from agentgym_core.types import TaskId, Termination, Trajectory, mean


def valid(trajectories: Iterable[Trajectory]) -> list[Trajectory]:
    """The trajectories that count: every one but env errors."""
    return [t for t in trajectories if t.termination != Termination.ENV_ERROR]


def by_task(trajectories: Iterable[Trajectory]) -> dict[TaskId, list[Trajectory]]:
    """Valid samples keyed by `task_id`, in first-seen order."""
    out: dict[TaskId, list[Trajectory]] = {}
    for t in valid(trajectories):
        out.setdefault(t.task_id, []).append(t)
    return out


def success_rate(trajectories: Iterable[Trajectory]) -> float:
    """Fraction of valid samples that succeeded, over all samples of all tasks.

    Equals `avg_at_k` when every task has the same number of valid samples.
    """
    return mean([float(t.success) for t in valid(trajectories)])


def mean_reward(trajectories: Iterable[Trajectory]) -> float:
    """Mean final episode reward (`Trajectory.reward`) over valid samples."""
    return mean([t.reward for t in valid(trajectories)])


def avg_at_k(trajectories: Iterable[Trajectory], k: int) -> float:
    """Avg@k: per task, the mean success of its samples; then the mean over tasks.

    With exactly k samples per task this is the mean success over the k
    samples of each task, averaged over tasks. A task with n != k valid samples
    uses all n: the mean is an unbiased estimate of its success probability for
    any n, so `k` only documents the sampling budget.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return mean([mean([float(t.success) for t in ts]) for ts in by_task(trajectories).values()])


def pass_at_k_estimate(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with n samples, c of them successful (Chen et al., 2021).

    `1 - C(n - c, k) / C(n, k)` when n >= k: the probability that k samples
    drawn without replacement from the n include a success. With n < k
    samples it returns pass@n (1.0 if any succeeded): a lower bound of pass@k.
    """
    if k < 1 or not 0 <= c <= n:
        raise ValueError(f"need k >= 1 and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n < k:
        return 1.0 if c > 0 else 0.0
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_at_k(trajectories: Iterable[Trajectory], k: int) -> float:
    """Pass@k: per task `pass_at_k_estimate(n, c, k)` over its valid samples; mean over tasks.

    Paper: https://arxiv.org/abs/2107.03374 (Codex, section 2.1).
    """
    return mean(
        [
            pass_at_k_estimate(len(ts), sum(t.success for t in ts), k)
            for ts in by_task(trajectories).values()
        ]
    )


UNKNOWN_GROUP = "unknown"
"""The group of an env_error episode whose task's group was never learnt."""


def group_of(trajectories: Sequence[Trajectory]) -> list[str]:
    """Each trajectory's `task_group` label for reports ('' for none).

    An episode that failed before the env was asked its group (a reset that
    raised) has no label: it counts in the group of its task's other samples,
    else in `UNKNOWN_GROUP` when the env labels groups at all, so the group
    rows add up to the whole. An episode the env gave no label keeps none.
    """
    known = {t.task_id: t.task_group for t in trajectories if t.task_group}
    out = []
    for t in trajectories:
        name = t.task_group
        if not name and known and t.termination == Termination.ENV_ERROR:
            name = known.get(t.task_id, UNKNOWN_GROUP)
        out.append(name)
    return out


def per_group(trajectories: Iterable[Trajectory], k: int) -> dict[str, dict[str, float]]:
    """The same metrics per `task_group` label (see `group_of`; unlabelled ones are skipped).

    Returns `{group: {success_rate, mean_reward, avg@k, pass@k, episodes, env_errors}}`,
    groups sorted by name.
    """
    trajectories = list(trajectories)
    groups: dict[str, list[Trajectory]] = {}
    for t, name in zip(trajectories, group_of(trajectories), strict=True):
        if name:
            groups.setdefault(name, []).append(t)
    return {name: _core(groups[name], k) for name in sorted(groups)}


def _core(trajectories: Sequence[Trajectory], k: int) -> dict[str, float]:
    counted = valid(trajectories)
    return {
        "success_rate": success_rate(counted),
        "mean_reward": mean_reward(counted),
        "avg@k": avg_at_k(counted, k),
        "pass@k": pass_at_k(counted, k),
        "episodes": float(len(counted)),
        "env_errors": float(len(trajectories) - len(counted)),
    }


def measured(metrics: dict[str, float], prefix: str = "") -> tuple[int, int]:
    """`(episodes measured, episodes played)` of a summary (or of `prefix`, e.g. a group)."""
    episodes = int(metrics.get(f"{prefix}episodes", 0))
    return episodes, episodes + int(metrics.get(f"{prefix}env_errors", 0))


def summarize(trajectories: Iterable[Trajectory], k: int) -> dict[str, float]:
    """Every evaluation metric as one flat dict (what `agentgym eval` prints and logs).

    Keys: `success_rate`, `mean_reward`, `avg@k`, `pass@k` (the literal names;
    `k` holds the value of k), `mean_turns` (actions per valid sample),
    `episodes` (valid samples), `tasks` (tasks with a valid sample),
    `env_errors` (samples dropped), and per `task_group` label
    `group/<name>/<metric>` for each metric of `per_group`.
    """
    trajectories = list(trajectories)
    counted = valid(trajectories)
    out = _core(trajectories, k)
    out["mean_turns"] = mean([float(t.num_turns) for t in counted])
    out["tasks"] = float(len(by_task(counted)))
    out["k"] = float(k)
    for name, metrics in per_group(trajectories, k).items():
        out.update({f"group/{name}/{key}": value for key, value in metrics.items()})
    return out
