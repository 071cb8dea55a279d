"""RLOO advantages and loss against values worked out by hand."""

import pytest
import torch
from agentgym_algo_rloo import RLOO, RLOOConfig
from agentgym_algo_rloo.loss import leave_one_out

from agentgym_core.interfaces import LossInputs
from agentgym_core.types import Termination, Trajectory, TrajectoryBatch

MASK = (0, 0, 1, 1, 0, 1)


def _traj(group: int, reward: float, logprobs=None, ref=None) -> Trajectory:
    n = len(MASK)
    return Trajectory(
        task_id=group,
        group=group,
        token_ids=list(range(n)),
        loss_mask=list(MASK),
        logprobs=list(logprobs or [0.0] * n),
        ref_logprobs=list(ref) if ref else None,
        reward=reward,
    )


def test_leave_one_out_by_hand():
    # [1, 0, 0, 1]: 1 - (0+0+1)/3 = 2/3 and 0 - (1+0+1)/3 = -2/3
    assert leave_one_out([1.0, 0.0, 0.0, 1.0]) == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])
    # [0.9, 0, 0]: 0.9 - 0 = 0.9 and 0 - (0.9 + 0)/2 = -0.45
    assert leave_one_out([0.9, 0.0, 0.0]) == pytest.approx([0.9, -0.45, -0.45])


def test_advantage_on_agent_tokens_per_group():
    batch = TrajectoryBatch(
        [_traj(0, 1.0), _traj(0, 0.0), _traj(1, 0.9), _traj(1, 0.0), _traj(1, 0.0)]
    )
    RLOO(RLOOConfig()).advantages(batch)
    a = [t.advantages for t in batch]
    assert a[0] == pytest.approx([0, 0, 1, 1, 0, 1])
    assert a[1] == pytest.approx([0, 0, -1, -1, 0, -1])
    assert [x[2] for x in a[2:]] == pytest.approx([0.9, -0.45, -0.45])


def test_lone_survivor_of_a_group_gets_no_advantage():
    broken = _traj(0, 0.0)
    broken.termination = Termination.ENV_ERROR
    batch = TrajectoryBatch([_traj(0, 1.0), broken, _traj(1, 1.0), _traj(1, 0.0)])
    RLOO(RLOOConfig()).advantages(batch)
    assert [t.advantages is None for t in batch] == [True, True, False, False]


def test_sequence_kl_comes_off_the_reward():
    # agent tokens 2, 3, 5: logp - ref = 0.5, -0.5, 1.0 -> sum 1.0; reward 1 - 0.1 * 1.0 = 0.9
    logp = [0, 0, -1.0, -2.0, 0, -0.5]
    ref = [9, 9, -1.5, -1.5, 9, -1.5]  # off-mask values must not count
    batch = TrajectoryBatch([_traj(0, 1.0, logp, ref), _traj(0, 0.0, [0.0] * 6, [0.0] * 6)])
    RLOO(RLOOConfig(kl_coef=0.1)).advantages(batch)
    assert [t.advantages[2] for t in batch] == pytest.approx([0.9, -0.9])


def test_needs():
    assert RLOO(RLOOConfig()).needs.group_size == 2
    assert not RLOO(RLOOConfig()).needs.reference
    assert RLOO(RLOOConfig(kl_coef=0.05)).needs.reference


def test_clipped_loss_and_entropy_by_hand():
    # ratio 0.5/0.4 = 1.25: A=+1 is clipped to 1.2 (-1.2), A=-1 keeps -1.25 (+1.25)
    inputs = LossInputs(
        logprobs=torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_(),
        old_logprobs=torch.log(torch.tensor([[0.4, 0.4]])),
        advantages=torch.tensor([[1.0, -1.0]]),
        mask=torch.tensor([[1.0, 1.0]]),
        entropy=torch.tensor([[2.0, 1.0]]),
        normalizer=2.0,
    )
    loss, metrics = RLOO(RLOOConfig(entropy_coef=0.01)).loss(inputs)
    assert float(loss.detach()) == pytest.approx((-1.2 + 1.25) / 2 - 0.01 * 1.5, abs=1e-6)
    assert metrics["clip_fraction"] == pytest.approx(0.5)
    assert metrics["entropy"] == pytest.approx(1.5)
