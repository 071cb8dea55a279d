"""REINFORCE++ (and -baseline) advantages and loss against values worked out by hand."""

import math

import pytest
import torch
from agentgym_algo_reinforce_pp import ReinforcePP, ReinforcePPConfig
from agentgym_algo_reinforce_pp.loss import discounted_returns

from agentgym_core.interfaces import LossInputs
from agentgym_core.types import Trajectory, TrajectoryBatch

MASK = (0, 0, 1, 1, 0, 1)


def _traj(group: int, reward: float, mask=MASK, logprobs=None, ref=None) -> Trajectory:
    n = len(mask)
    return Trajectory(
        task_id=group,
        group=group,
        token_ids=list(range(n)),
        loss_mask=list(mask),
        logprobs=list(logprobs or [0.0] * n),
        ref_logprobs=list(ref) if ref else None,
        reward=reward,
    )


def test_discounted_returns_by_hand():
    # G = r + 0.5 G': 0.9; 0.05 + 0.45 = 0.5; -0.05 + 0.25 = 0.2
    assert discounted_returns([-0.05, 0.05, 0.9], 0.5) == pytest.approx([0.2, 0.5, 0.9])


def test_kl_in_reward_and_discount_before_normalization():
    # agent tokens 2, 3, 5: logp - ref = 0.5, -0.5, 1.0 -> rewards -0.05, +0.05, -0.1 + 1
    # returns (gamma 0.5) 0.2, 0.5, 0.9; the second trajectory: all 0.
    logp = [0, 0, -1.0, -2.0, 0, -0.5]
    ref = [0, 0, -1.5, -1.5, 0, -1.5]
    batch = TrajectoryBatch([_traj(0, 1.0, logprobs=logp, ref=ref), _traj(1, 0.0, ref=[0.0] * 6)])
    ReinforcePP(ReinforcePPConfig(kl_coef=0.1, gamma=0.5)).advantages(batch)
    raw = [0.2, 0.5, 0.9, 0.0, 0.0, 0.0]
    mean = sum(raw) / 6
    std = math.sqrt(sum((x - mean) ** 2 for x in raw) / 6)
    want = [(x - mean) / std for x in raw]
    got = [batch.trajectories[0].advantages[i] for i in (2, 3, 5)]
    got += [batch.trajectories[1].advantages[i] for i in (2, 3, 5)]
    assert got == pytest.approx(want, rel=1e-6)
    assert [batch.trajectories[0].advantages[i] for i in (0, 1, 4)] == [0.0, 0.0, 0.0]


def test_global_normalization_by_hand():
    # tokens: three 1s, six 0s -> mean 1/3, std sqrt(2)/3 -> +sqrt(2) and -1/sqrt(2)
    batch = TrajectoryBatch([_traj(0, 1.0), _traj(0, 0.0), _traj(1, 0.0)])
    ReinforcePP(ReinforcePPConfig(kl_coef=0.0)).advantages(batch)
    got = [t.advantages[2] for t in batch]
    assert got == pytest.approx([math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2)], rel=1e-6)


def test_baseline_subtracts_the_group_mean_first():
    # groups [1, 0] and [1, 1] -> 0.5, -0.5, 0, 0 (3 tokens each): mean 0, std sqrt(1/8)
    batch = TrajectoryBatch([_traj(0, 1.0), _traj(0, 0.0), _traj(1, 1.0), _traj(1, 1.0)])
    ReinforcePP(ReinforcePPConfig(kl_coef=0.0, baseline=True)).advantages(batch)
    got = [t.advantages[2] for t in batch]
    assert got == pytest.approx([math.sqrt(2), -math.sqrt(2), 0.0, 0.0], rel=1e-6)
    # without the baseline the all-success group is not neutral: 1 -> +1/sqrt(3)
    ReinforcePP(ReinforcePPConfig(kl_coef=0.0)).advantages(batch)
    assert batch.trajectories[2].advantages[2] == pytest.approx(1 / math.sqrt(3), rel=1e-6)


def test_outcome_reaches_an_episode_that_ends_on_an_observation():
    # 3 turns; the sequence ends with observation tokens (a context-budget stop)
    mask = (0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0)
    batch = TrajectoryBatch([_traj(0, 1.0, mask=mask), _traj(1, 0.0, mask=mask)])
    ReinforcePP(ReinforcePPConfig(kl_coef=0.0)).advantages(batch)
    won, lost = batch.trajectories
    assert all(won.advantages[i] == pytest.approx(1.0) for i, m in enumerate(mask) if m)
    assert all(lost.advantages[i] == pytest.approx(-1.0) for i, m in enumerate(mask) if m)
    assert all(won.advantages[i] == 0.0 for i, m in enumerate(mask) if not m)


def test_kl_needs_reference_logprobs():
    batch = TrajectoryBatch([_traj(0, 1.0)])
    with pytest.raises(ValueError, match="ref_logprobs"):
        ReinforcePP(ReinforcePPConfig(kl_coef=0.1)).advantages(batch)


def test_needs():
    assert ReinforcePP(ReinforcePPConfig()).needs.reference
    assert not ReinforcePP(ReinforcePPConfig(kl_coef=0.0)).needs.reference
    assert ReinforcePP(ReinforcePPConfig()).needs.group_size == 1
    assert ReinforcePP(ReinforcePPConfig(baseline=True)).needs.group_size == 2


def test_loss_is_the_clipped_surrogate_and_reports_kl():
    inputs = LossInputs(
        logprobs=torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_(),
        old_logprobs=torch.log(torch.tensor([[0.4, 0.4]])),
        advantages=torch.tensor([[1.0, -1.0]]),
        mask=torch.tensor([[1.0, 1.0]]),
        entropy=torch.zeros(1, 2),
        normalizer=2.0,
        ref_logprobs=torch.log(torch.tensor([[0.25, 0.25]])),
    )
    loss, metrics = ReinforcePP(ReinforcePPConfig()).loss(inputs)
    assert float(loss.detach()) == pytest.approx((-1.2 + 1.25) / 2)  # KL acts via the reward
    assert metrics["kl"] == pytest.approx(math.log(2))
