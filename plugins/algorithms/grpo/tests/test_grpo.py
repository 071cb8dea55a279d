"""GRPO advantages and loss against values worked out by hand."""

import math

import pytest
import torch
from agentgym_algo_grpo import GRPO, GRPOConfig
from pydantic import ValidationError

from agentgym_core.interfaces import LossInputs
from agentgym_core.learner.losses import kl_k3
from agentgym_core.types import Termination, Trajectory, TrajectoryBatch


def _traj(group: int, reward: float, mask=(0, 0, 1, 1, 0, 1)) -> Trajectory:
    n = len(mask)
    return Trajectory(
        task_id=group,
        group=group,
        token_ids=list(range(n)),
        loss_mask=list(mask),
        logprobs=[0.0] * n,
        reward=reward,
    )


def test_group_advantages_normalized_by_std():
    # group 0: rewards 1, 0, 0, 1 -> mean 0.5, std 0.5 -> +1, -1, -1, +1
    # group 1: one success a = 0.8875 of three -> sqrt(2), -1/sqrt(2), -1/sqrt(2) whatever a is
    batch = TrajectoryBatch(
        [
            _traj(0, 1.0),
            _traj(0, 0.0),
            _traj(0, 0.0),
            _traj(0, 1.0),
            _traj(1, 0.8875),
            _traj(1, 0.0),
            _traj(1, 0.0),
        ]
    )
    GRPO(GRPOConfig(eps=1e-12)).advantages(batch)
    got = [t.advantages[2] for t in batch]
    want = [1, -1, -1, 1, math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2)]
    assert got == pytest.approx(want, rel=1e-6)


def test_advantage_only_on_agent_tokens():
    batch = TrajectoryBatch([_traj(0, 1.0), _traj(0, 0.0)])
    GRPO(GRPOConfig(eps=1e-12)).advantages(batch)
    assert batch.trajectories[0].advantages == pytest.approx([0, 0, 1, 1, 0, 1])
    assert batch.trajectories[1].advantages == pytest.approx([0, 0, -1, -1, 0, -1])


def test_no_std_scaling_is_mean_centred():
    batch = TrajectoryBatch([_traj(0, 0.9), _traj(0, 0.0), _traj(0, 0.0)])
    GRPO(GRPOConfig(scale_by_std=False)).advantages(batch)
    assert [t.advantages[2] for t in batch] == pytest.approx([0.6, -0.3, -0.3])


def test_equal_rewards_give_zero_advantage_and_env_errors_are_excluded():
    broken = _traj(0, 0.0)
    broken.termination = Termination.ENV_ERROR
    batch = TrajectoryBatch([_traj(0, 1.0), _traj(0, 1.0), broken])
    GRPO(GRPOConfig()).advantages(batch)
    assert batch.trajectories[0].advantages[2] == 0.0
    assert broken.advantages is None


def _inputs(ref=None, entropy=(0.0, 0.0)):
    # token 1: ratio 0.5/0.4 = 1.25 with A=+1 -> clipped to 1.2 -> loss -1.2
    # token 2: ratio 1.25 with A=-1 -> min(-1.25, -1.2) = -1.25 -> loss +1.25
    logp = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_()
    return LossInputs(
        logprobs=logp,
        old_logprobs=torch.log(torch.tensor([[0.4, 0.4]])),
        advantages=torch.tensor([[1.0, -1.0]]),
        mask=torch.tensor([[1.0, 1.0]]),
        entropy=torch.tensor([list(entropy)]),
        normalizer=2.0,
        ref_logprobs=ref,
    )


def test_clipped_loss_by_hand():
    loss, metrics = GRPO(GRPOConfig(clip_eps=0.2)).loss(_inputs())
    assert float(loss.detach()) == pytest.approx((-1.2 + 1.25) / 2)
    assert metrics["clip_fraction"] == pytest.approx(0.5)
    assert metrics["ratio"] == pytest.approx(1.25)


def test_clip_higher_changes_only_the_upper_side():
    loss, _ = GRPO(GRPOConfig(clip_eps=0.2, clip_eps_high=0.3)).loss(_inputs())
    assert float(loss.detach()) == pytest.approx((-1.25 + 1.25) / 2)


def test_k3_kl_by_hand():
    # d = log(0.25) - log(0.5) = -log 2: exp(d) - d - 1 = 0.5 + log 2 - 1
    value = kl_k3(torch.log(torch.tensor(0.5)), torch.log(torch.tensor(0.25)))
    assert float(value) == pytest.approx(math.log(2) - 0.5)
    ref = torch.log(torch.tensor([[0.25, 0.25]]))
    plain, _ = GRPO(GRPOConfig()).loss(_inputs())
    with_kl, metrics = GRPO(GRPOConfig(kl_coef=0.1)).loss(_inputs(ref=ref))
    assert float((with_kl - plain).detach()) == pytest.approx(0.1 * (math.log(2) - 0.5))
    assert metrics["kl"] == pytest.approx(math.log(2) - 0.5)


def test_entropy_bonus_lowers_loss():
    plain, _ = GRPO(GRPOConfig()).loss(_inputs(entropy=(2.0, 1.0)))
    bonus, metrics = GRPO(GRPOConfig(entropy_coef=0.01)).loss(_inputs(entropy=(2.0, 1.0)))
    assert float((plain - bonus).detach()) == pytest.approx(0.01 * 1.5)
    assert metrics["entropy"] == pytest.approx(1.5)


def test_reference_needed_only_with_kl():
    assert not GRPO(GRPOConfig()).needs.reference
    assert GRPO(GRPOConfig(kl_coef=0.05)).needs.reference


def test_uniform_groups_can_be_dropped():
    batch = TrajectoryBatch([_traj(0, 1.0), _traj(0, 1.0), _traj(1, 1.0), _traj(1, 0.0)])
    GRPO(GRPOConfig(drop_uniform_groups=True)).advantages(batch)
    assert [t.advantages is None for t in batch] == [True, True, False, False]
    GRPO(GRPOConfig()).advantages(batch)
    assert batch.trajectories[0].advantages == [0.0] * 6


def test_std_choice_population_by_default_or_sample():
    # rewards 1, 0, 0, 1: mean 0.5; population std 0.5 -> +-1; sample std sqrt(1/3) -> +-sqrt(3)/2
    rewards = (1.0, 0.0, 0.0, 1.0)
    assert GRPOConfig().std == "population"
    batch = TrajectoryBatch([_traj(0, r) for r in rewards])
    GRPO(GRPOConfig(std="sample", eps=1e-12)).advantages(batch)
    want = [math.sqrt(3) / 2, -math.sqrt(3) / 2, -math.sqrt(3) / 2, math.sqrt(3) / 2]
    assert [t.advantages[2] for t in batch] == pytest.approx(want, rel=1e-9)


def test_older_scale_by_std_key_still_loads():
    assert GRPOConfig.model_validate({"scale_by_std": False}).std == "none"
    assert GRPOConfig.model_validate({"scale_by_std": True}).std == "population"
    assert GRPOConfig.model_validate({"scale_by_std": True, "std": "sample"}).std == "sample"
    with pytest.raises(ValidationError, match="contradicts std: sample; give only `std`"):
        GRPOConfig.model_validate({"scale_by_std": False, "std": "sample"})
    with pytest.raises(ValidationError, match="Input should be 'population', 'sample' or 'none'"):
        GRPOConfig(std="n")


def test_every_field_documented():
    assert all(field.description for field in GRPOConfig.model_fields.values())
