"""Decoupled PPO for stale rollouts: the truncated behaviour weights, by hand."""

from __future__ import annotations

import math
import random

import pytest
import torch

from agentgym_core.learner.decoupled import importance_weights
from agentgym_core.learner.learner import Learner, LearnerSettings, token_logprobs
from agentgym_core.learner.packing import pack
from agentgym_core.types import Trajectory


def test_importance_weights_by_hand():
    # tokens 1 and 3 were sampled; the proximal policy likes token 1 three times more than
    # the behaviour policy did (truncated at 2) and token 3 half as much
    proximal = [0.0, math.log(0.6), 0.0, math.log(0.1)]
    behaviour = [0.0, math.log(0.2), 0.0, math.log(0.2)]
    weights, raw = importance_weights(proximal, behaviour, [0, 1, 0, 1], cap=2.0)
    assert weights == pytest.approx([0.0, 2.0, 0.0, 0.5])
    assert raw == pytest.approx([3.0, 0.5])
    weights, _ = importance_weights(proximal, behaviour, [0, 1, 0, 1], cap=5.0)
    assert weights == pytest.approx([0.0, 3.0, 0.0, 0.5])


def test_learner_decouple_scales_advantages_and_takes_proximal_logprobs(tiny_model):
    """The learner's step: advantages times min(pi_prox / pi_behav, cap), proximal as old."""
    from agentgym_algo_grpo import GRPO, GRPOConfig

    model, _ = tiny_model
    rng = random.Random(0)
    ids = [rng.randrange(3, model.config.vocab_size) for _ in range(14)]
    mask = [0] * 6 + [1] * 8
    traj = Trajectory(task_id=0, group=0, token_ids=ids, loss_mask=mask, logprobs=[0.0] * 14)
    (mb,) = pack([traj], row_tokens=None, micro_batch_tokens=1000)
    with torch.no_grad():
        proximal = [0.0] + token_logprobs(model, mb, 1.0)[0][0, :-1].tolist()
    ratios = [3.0, 0.5, 1.0, 1.5] * 2  # pi_prox / pi_behav on the 8 sampled tokens
    behaviour = list(proximal)
    for position, ratio in zip(range(6, 14), ratios, strict=True):
        behaviour[position] = proximal[position] - math.log(ratio)
    traj.logprobs = behaviour
    traj.advantages = [0.5 * m for m in mask]
    learner = Learner(model, GRPO(GRPOConfig()), LearnerSettings(lr=1e-2))
    stats = learner._decouple([traj], cap=2.0)
    assert traj.advantages[:6] == [0.0] * 6
    assert traj.advantages[6:] == pytest.approx([0.5 * min(r, 2.0) for r in ratios], rel=1e-4)
    assert traj.logprobs[6:] == pytest.approx(proximal[6:], abs=1e-5)
    assert stats["importance_weight_mean"] == pytest.approx(
        sum(min(r, 2.0) for r in ratios) / 8, rel=1e-4
    )
    assert stats["importance_weight_max"] == pytest.approx(3.0, rel=1e-4)
    assert stats["importance_truncated_fraction"] == pytest.approx(2 / 8)
    assert stats["behaviour_logprob_diff"] == pytest.approx(
        sum(abs(math.log(r)) for r in ratios) / 8, rel=1e-4
    )


def test_one_step_update_weighs_in_the_loss_pass_as_the_up_front_pass_does(tiny_model):
    """epochs 1, mini_batches 1: the proximal values come from the loss's own forward pass;
    the update and its statistics match weighing every trajectory up front."""
    import copy

    from agentgym_algo_grpo import GRPO, GRPOConfig

    from agentgym_core.types import TrajectoryBatch

    model, _ = tiny_model
    rng = random.Random(1)
    trajectories = []
    for index in range(4):
        length = 10 + 3 * index
        ids = [rng.randrange(3, model.config.vocab_size) for _ in range(length)]
        mask = [0] * 5 + [1] * (length - 5)
        # behaviour log-probabilities far enough from the model's that some weights truncate
        behaviour = [rng.uniform(-9.0, -4.0) * m for m in mask]
        advantage = 1.0 if index % 2 else -1.0
        traj = Trajectory(task_id=index, group=0, token_ids=ids, loss_mask=mask, logprobs=behaviour)
        traj.advantages = [advantage * m for m in mask]
        trajectories.append(traj)
    twin = [copy.deepcopy(t) for t in trajectories]
    settings = {"lr": 1e-2, "epochs": 1, "mini_batches": 1}
    one_pass = Learner(
        copy.deepcopy(model), GRPO(GRPOConfig()), LearnerSettings(**settings, importance_cap=2.0)
    )
    up_front = Learner(copy.deepcopy(model), GRPO(GRPOConfig()), LearnerSettings(**settings))
    expected = up_front._decouple(twin, cap=2.0)
    assert 0 < expected["importance_truncated_fraction"] < 1  # both branches of the cap

    got = one_pass.update(TrajectoryBatch(trajectories))
    reference = up_front.update(TrajectoryBatch(twin))

    for key in ("importance_weight_mean", "importance_weight_max", "importance_truncated_fraction"):
        assert got[key] == pytest.approx(expected[key], rel=1e-4), key
    drift = expected["behaviour_logprob_diff"]
    assert got["sampler_logprob_diff"] == pytest.approx(drift, rel=1e-4)
    # the weighted loss and its gradient (Adam's first step is nearly sign(gradient): the
    # parameters alone would hardly tell a weighting error)
    assert got["loss"] == pytest.approx(reference["loss"], rel=1e-4)
    assert got["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-4)
    for mine, theirs in zip(
        one_pass.unwrapped.parameters(), up_front.unwrapped.parameters(), strict=True
    ):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-4)
    moved = any(
        not torch.equal(mine, start)
        for mine, start in zip(one_pass.unwrapped.parameters(), model.parameters(), strict=True)
    )
    assert moved
