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


# -- partial results: counts that add up, and a rate never shown without them ---------


def failed_at_reset(task):
    """An env_error episode whose reset raised: the env was never asked its group."""
    return traj(task, False, error=True, turns=0)


def partial_eval():
    """Tasks 0-3 (levels a, a, b, b) x 2 samples; the server died during task 2's samples."""
    return (
        samples(0, [1, 1], group="a")
        + samples(1, [1, 0], group="a")
        + samples(2, [1], group="b")
        + [failed_at_reset(2)]
        + [failed_at_reset(3), failed_at_reset(3)]
    )


def test_env_errors_count_in_their_tasks_group_or_unknown_so_groups_add_up():
    trajs = partial_eval()
    summary = summarize(trajs, k=2)
    assert summary["env_errors"] == 3 and summary["episodes"] == 5
    groups = per_group(trajs, k=2)
    assert list(groups) == ["a", "b", "unknown"]  # task 2's sample joins b; task 3 is unknown
    assert groups["b"]["env_errors"] == 1 and groups["unknown"]["env_errors"] == 2
    for key in ("episodes", "env_errors"):
        assert sum(g[key] for g in groups.values()) == summary[key]
    assert groups["unknown"]["episodes"] == 0


def test_an_env_without_groups_gets_no_unknown_group():
    trajs = samples(0, [1, 0]) + [failed_at_reset(1)]
    assert per_group(trajs, k=2) == {}


def test_a_complete_table_shows_plain_rates():
    from agentgym_core.run.eval_stage import eval_table

    table = eval_table(summarize(samples(0, [1, 0], group="a"), k=2), k=2)
    assert "PARTIAL" not in table
    assert table.splitlines()[0].split() == [
        *("group", "success_rate", "mean_reward", "avg@2", "pass@2", "episodes", "env_errors"),
    ]


def test_a_partial_table_says_so_above_and_beside_every_success_rate():
    from agentgym_core.run.eval_stage import eval_table

    metrics = summarize(partial_eval(), k=2)
    metrics["partial"] = 1.0
    lines = eval_table(metrics, k=2).splitlines()
    assert lines[0] == (
        "PARTIAL EVALUATION: 3 of 8 episodes ended in env_error; "
        "the rates below count only the 5 measured."
    )
    rows = {line.split()[0]: line for line in lines[3:]}
    assert "0.800 (5 of 8 episodes, PARTIAL)" in rows["all"]  # 4 of the 5 measured succeeded
    assert rows["a"].split()[1] == "0.750" and "PARTIAL" not in rows["a"]  # a lost nothing
    assert "1.000 (1 of 2 episodes, PARTIAL)" in rows["b"]
    assert "- (0 of 2 episodes, PARTIAL)" in rows["unknown"]  # no rate from nothing
    env_errors = [float(line.split()[-1]) for line in lines[3:]]
    assert env_errors[0] == sum(env_errors[1:]) == 3


def test_a_comparison_marks_the_partial_stage_only():
    from types import SimpleNamespace

    from agentgym_core.run.eval_stage import comparison_table

    def stage(name, policy):
        root = SimpleNamespace(policy=SimpleNamespace(name=policy), eval=SimpleNamespace(k=2))
        return SimpleNamespace(name=name, config=SimpleNamespace(root=root))

    whole = summarize(samples(0, [1, 0], group="a") + samples(2, [0, 0], group="b"), k=2)
    partial = summarize(partial_eval(), k=2)
    lines = comparison_table([(stage("api", "openai"), whole), (stage("ckpt", "hf"), partial)])
    lines = lines.splitlines()
    assert lines[0].startswith("[ckpt] PARTIAL EVALUATION: 3 of 8 episodes ended in env_error")
    api = next(line for line in lines if line.startswith("api "))
    ckpt = next(line for line in lines if line.startswith("ckpt "))
    assert "PARTIAL" not in api
    assert "0.800 (5 of 8 episodes, PARTIAL)" in ckpt and "1.000 (1 of 2 episodes, PARTIAL)" in ckpt


def test_the_json_record_of_a_partial_evaluation_leads_with_it():
    from agentgym_core.run.eval_stage import eval_record

    metrics = summarize(partial_eval(), k=2)
    metrics["partial"] = 1.0
    record = eval_record(metrics, "PARTIAL EVALUATION: 3 of 8 ...", "ConnectionError: refused")
    assert list(record)[:6] == [
        *("partial", "warning", "last_env_error", "episodes", "episodes_played", "env_errors"),
    ]
    assert record["partial"] is True and record["warning"].startswith("PARTIAL EVALUATION")
    assert (record["episodes"], record["episodes_played"], record["env_errors"]) == (5, 8, 3)
    assert record["success_rate"] == pytest.approx(0.8)
    whole = eval_record(summarize(samples(0, [1, 0]), k=2))
    assert whole["partial"] is False and "warning" not in whole and whole["episodes_played"] == 2


def test_the_json_record_has_no_rate_of_a_group_that_measured_nothing():
    from agentgym_core.run.eval_stage import eval_record

    record = eval_record(summarize(partial_eval(), k=2))
    assert record["group/unknown/episodes"] == 0 and record["group/unknown/env_errors"] == 2
    assert record["group/unknown/success_rate"] is None and record["group/unknown/avg@k"] is None
    assert record["group/b/success_rate"] == 1.0
    assert eval_record(summarize([failed_at_reset(1)], k=1))["success_rate"] is None
