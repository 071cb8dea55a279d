"""Evaluation metrics against hand-computed values."""

from __future__ import annotations

import math

import pytest

from agentgym_core.evaluation.metrics import (
    avg_at_k,
    mean_reward,
    pass_at_k,
    pass_at_k_estimate,
    per_group,
    success_rate,
    summarize,
)
from agentgym_core.types import Termination, Trajectory, Turn


def traj(task, success, *, group="", reward=None, turns=1, error=False):
    return Trajectory(
        task_id=task,
        group=task,
        turns=[Turn(f"a{i}", f"o{i}", 0.0) for i in range(turns)],
        reward=float(success) if reward is None else reward,
        success=success,
        termination=Termination.ENV_ERROR if error else Termination.DONE,
        error="boom" if error else None,
        task_group=group,
    )


def samples(task, outcomes, **kwargs):
    return [traj(task, bool(o), **kwargs) for o in outcomes]


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (4, 0, 2, 0.0),
        (4, 3, 2, 1.0),  # n - c < k: every pair holds a success
        (5, 2, 1, 0.4),  # pass@1 is the success rate
        (10, 3, 5, 1 - 21 / 252),  # C(7,5) = 21, C(10,5) = 252
        (1, 1, 3, 1.0),  # n < k: pass@n
        (2, 0, 3, 0.0),
    ],
)
def test_pass_at_k_estimate(n, c, k, expected):
    assert pass_at_k_estimate(n, c, k) == pytest.approx(expected)


def test_pass_at_k_estimate_matches_product_form():
    # Chen et al.'s numerically stable form: 1 - prod_{i=n-c+1}^{n} (1 - k / i).
    n, c, k = 20, 4, 6
    stable = 1 - math.prod(1 - k / i for i in range(n - c + 1, n + 1))
    assert pass_at_k_estimate(n, c, k) == pytest.approx(stable)


def test_pass_at_k_estimate_rejects_bad_counts():
    with pytest.raises(ValueError):
        pass_at_k_estimate(2, 3, 1)
    with pytest.raises(ValueError):
        pass_at_k_estimate(2, 1, 0)


def test_avg_and_pass_at_k_average_over_tasks():
    # task 0: 1/4 succeed; task 1: 4/4; task 2: 0/4.
    trajs = samples(0, [1, 0, 0, 0]) + samples(1, [1, 1, 1, 1]) + samples(2, [0, 0, 0, 0])
    assert avg_at_k(trajs, 4) == pytest.approx((0.25 + 1 + 0) / 3)
    assert pass_at_k(trajs, 2) == pytest.approx((0.5 + 1 + 0) / 3)
    assert pass_at_k(trajs, 4) == pytest.approx((1 + 1 + 0) / 3)
    assert pass_at_k(trajs, 1) == pytest.approx(avg_at_k(trajs, 1))


def test_avg_at_k_weights_tasks_equally_unlike_success_rate():
    trajs = samples(0, [1, 1, 1, 1]) + samples(1, [0, 0])
    assert avg_at_k(trajs, 4) == pytest.approx(0.5)
    assert success_rate(trajs) == pytest.approx(4 / 6)


def test_env_errors_are_excluded_and_counted():
    trajs = samples(0, [1, 0]) + [traj(0, False, error=True), traj(1, False, error=True)]
    assert success_rate(trajs) == pytest.approx(0.5)
    assert pass_at_k(trajs, 2) == pytest.approx(1.0)  # n=2, c=1: task 1 has no samples
    summary = summarize(trajs, k=2)
    assert summary["env_errors"] == 2
    assert summary["episodes"] == 2
    assert summary["tasks"] == 1
    assert summary["avg@k"] == pytest.approx(0.5)


def test_mean_reward_and_turns():
    trajs = [
        traj(0, True, reward=1.0, turns=2),
        traj(0, False, reward=-0.5, turns=4),
        traj(1, False, reward=9.0, turns=7, error=True),
    ]
    assert mean_reward(trajs) == pytest.approx(0.25)
    assert summarize(trajs, 1)["mean_turns"] == pytest.approx(3.0)


def test_per_group_breakdown():
    trajs = (
        samples(0, [1, 1], group="easy")
        + samples(1, [1, 0], group="hard")
        + samples(2, [0, 0], group="hard")
        + samples(3, [1, 1])
    )
    groups = per_group(trajs, k=2)
    assert list(groups) == ["easy", "hard"]
    assert groups["easy"]["success_rate"] == 1.0
    assert groups["hard"]["success_rate"] == pytest.approx(0.25)
    assert groups["hard"]["pass@k"] == pytest.approx(0.5)  # task 1: 1.0, task 2: 0.0
    summary = summarize(trajs, k=2)
    assert summary["group/hard/success_rate"] == pytest.approx(0.25)
    assert summary["group/easy/episodes"] == 2
    assert summary["success_rate"] == pytest.approx(5 / 8)
    assert not any(key.startswith("group//") for key in summary)


def test_summarize_keys_and_empty_input():
    summary = summarize([], k=3)
    for key in ("success_rate", "mean_reward", "avg@k", "pass@k", "mean_turns", "env_errors"):
        assert summary[key] == 0.0
    assert summary["k"] == 3.0
