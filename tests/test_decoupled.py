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
