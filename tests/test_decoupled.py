"""Off-policy corrections: behaviour weights by hand, each strategy against the others."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch

from agentgym_core.learner.decoupled import BehaviourWeights, importance_weights
from agentgym_core.learner.forward import token_logprobs
from agentgym_core.learner.learner import Learner
from agentgym_core.learner.offpolicy import (
    DecoupledInPass,
    DecoupledUpFront,
    OffPolicySettings,
    OnPolicy,
    Recomputed,
    correction_for,
)
from agentgym_core.learner.packing import pack
from agentgym_core.learner.settings import LearnerSettings
from agentgym_core.types import Trajectory, TrajectoryBatch


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
    # AReaL's masking: a token over the cap is dropped, not capped
    weights, _ = importance_weights(proximal, behaviour, [0, 1, 0, 1], cap=2.0, mode="mask")
    assert weights == pytest.approx([0.0, 0.0, 0.0, 0.5])


@pytest.mark.parametrize(
    ("mode", "expected", "over_key"),
    [
        ("truncate", [2.0, 0.5, 1.0], "importance_truncated_fraction"),
        ("mask", [0.0, 0.5, 1.0], "importance_masked_fraction"),
    ],
)
def test_behaviour_weights_and_their_statistics_by_hand(mode, expected, over_key):
    ratios = [3.0, 0.5, 1.0]  # pi_prox / pi_behav on three sampled tokens; a prompt token first
    behaviour = torch.tensor([[0.0, *(math.log(0.1) for _ in ratios)]])
    proximal = behaviour + torch.tensor([[5.0, *(math.log(r) for r in ratios)]])
    mask = torch.tensor([[0, 1, 1, 1]])
    tally = BehaviourWeights(2.0, mode)
    weights = tally.weigh(proximal, behaviour, mask, tally=True)
    assert weights[0].tolist() == pytest.approx([0.0, *expected], rel=1e-5)
    stats = tally.stats()
    assert stats["importance_weight_mean"] == pytest.approx(sum(expected) / 3, rel=1e-5)
    assert stats["importance_weight_max"] == pytest.approx(3.0, rel=1e-5)
    assert stats[over_key] == pytest.approx(1 / 3)
    gaps = sum(abs(math.log(r)) for r in ratios) / 3
    assert stats["sampler_logprob_diff"] == pytest.approx(gaps, rel=1e-5)


def test_the_settings_choose_the_correction():
    fresh, stale = OffPolicySettings(), OffPolicySettings(max_staleness=1)
    assert isinstance(correction_for(fresh, steps=1, dropout=False), OnPolicy)
    assert isinstance(correction_for(fresh, steps=2, dropout=False), Recomputed)
    assert isinstance(correction_for(stale, steps=1, dropout=False), DecoupledInPass)
    assert isinstance(correction_for(stale, steps=2, dropout=False), DecoupledUpFront)
    # a train-mode pass with dropout is a noisy proximal policy: weigh in eval mode, up front
    assert isinstance(correction_for(stale, steps=1, dropout=True), DecoupledUpFront)


def _trajectory(model, seed: int, length: int = 14) -> tuple[Trajectory, list[float]]:
    """A trajectory with 8 sampled tokens and the model's own log-probabilities of it."""
    rng = random.Random(seed)
    ids = [rng.randrange(3, model.config.vocab_size) for _ in range(length)]
    mask = [0] * (length - 8) + [1] * 8
    traj = Trajectory(task_id=0, group=0, token_ids=ids, loss_mask=mask, logprobs=[0.0] * length)
    (mb,) = pack([traj], row_tokens=None, micro_batch_tokens=1000)
    with torch.no_grad():
        own = [0.0] + token_logprobs(model.eval(), mb, 1.0)[0][0, :-1].tolist()
    return traj, own


def test_up_front_correction_packs_proximal_logprobs_and_weighted_advantages(tiny_model):
    """Decoupled PPO up front: old = the learner's, advantage x min(pi_prox / pi_behav, cap)."""
    from agentgym_algo_grpo import GRPO, GRPOConfig

    model, _ = tiny_model
    traj, proximal = _trajectory(model, 0)
    ratios = [3.0, 0.5, 1.0, 1.5] * 2  # pi_prox / pi_behav on the 8 sampled tokens
    behaviour = list(proximal)
    for position, ratio in zip(range(6, 14), ratios, strict=True):
        behaviour[position] = proximal[position] - math.log(ratio)
    traj.logprobs = behaviour
    traj.advantages = [0.5 * m for m in traj.loss_mask]
    before = copy.deepcopy(traj)
    learner = Learner(model, GRPO(GRPOConfig()), LearnerSettings(lr=1e-2))
    correction = DecoupledUpFront(2.0)
    columns = correction.prepare([traj], learner._proximal)
    assert columns["weighted_advantages"][0][:6] == [0.0] * 6
    assert columns["weighted_advantages"][0][6:] == pytest.approx(
        [0.5 * min(r, 2.0) for r in ratios], rel=1e-4
    )
    assert columns["old_logprobs"][0][6:] == pytest.approx(proximal[6:], abs=1e-5)
    assert traj == before  # the trajectory is only read
    stats = correction.stats()
    assert stats["importance_weight_mean"] == pytest.approx(
        sum(min(r, 2.0) for r in ratios) / 8, rel=1e-4
    )
    assert stats["importance_weight_max"] == pytest.approx(3.0, rel=1e-4)
    assert stats["importance_truncated_fraction"] == pytest.approx(2 / 8)
    assert stats["sampler_logprob_diff"] == pytest.approx(
        sum(abs(math.log(r)) for r in ratios) / 8, rel=1e-4
    )


def _stale_batch(model) -> list[Trajectory]:
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
    return trajectories


@pytest.mark.parametrize("mode", ["truncate", "mask"])
def test_one_step_update_weighs_in_the_loss_pass_as_the_up_front_pass_does(tiny_model, mode):
    """epochs 1, mini_batches 1: the proximal values come from the loss's own forward pass;
    the update and its statistics match weighing every trajectory up front."""
    from agentgym_algo_grpo import GRPO, GRPOConfig

    model, _ = tiny_model
    trajectories = _stale_batch(model)
    twin = copy.deepcopy(trajectories)
    stale = OffPolicySettings(max_staleness=1, importance_cap=2.0, importance_mode=mode)
    settings = LearnerSettings(lr=1e-2, off_policy=stale)
    one_pass = Learner(copy.deepcopy(model), GRPO(GRPOConfig()), settings)
    up_front = Learner(copy.deepcopy(model), GRPO(GRPOConfig()), settings)

    got = one_pass.update(TrajectoryBatch(trajectories))
    reference = up_front.update(TrajectoryBatch(twin), DecoupledUpFront(2.0, mode))

    over = f"importance_{'truncated' if mode == 'truncate' else 'masked'}_fraction"
    assert 0 < reference[over] < 1  # both branches of the cap
    for key in ("importance_weight_mean", "importance_weight_max", over, "sampler_logprob_diff"):
        assert got[key] == pytest.approx(reference[key], rel=1e-4), key
    # the weighted loss and its gradient (Adam's first step is nearly sign(gradient): the
    # parameters alone would hardly tell a weighting error)
    assert got["loss"] == pytest.approx(reference["loss"], rel=1e-4)
    assert got["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-4)
    for mine, theirs in zip(
        one_pass.unwrapped.parameters(), up_front.unwrapped.parameters(), strict=True
    ):
        # Adam's first step is lr * g / (|g| + eps): where g is tiny, the last bits of the
        # weights (float64 up front, float32 in the pass) show; a masked token flips more of them
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-4 if mode == "truncate" else 1e-3)
    moved = any(
        not torch.equal(mine, start)
        for mine, start in zip(one_pass.unwrapped.parameters(), model.parameters(), strict=True)
    )
    assert moved
    unweighted = Learner(copy.deepcopy(model), GRPO(GRPOConfig()), LearnerSettings(lr=1e-2))
    plain = unweighted.update(TrajectoryBatch(copy.deepcopy(twin)))
    assert got["loss"] != pytest.approx(plain["loss"], rel=1e-3)  # the weights did something
    assert trajectories == _stale_batch(model)  # the update only read its batch


def test_a_model_with_dropout_is_weighed_up_front_in_eval_mode(tiny_model):
    """A train-mode pass with dropout would give noisy proximal values: they come up front,
    in eval mode, the same however often they are computed."""
    from agentgym_algo_grpo import GRPO, GRPOConfig

    model, _ = tiny_model
    config = copy.deepcopy(model.config)
    config.attention_dropout = 0.5
    dropping = type(model)(config)
    dropping.load_state_dict(model.state_dict())
    stale = OffPolicySettings(max_staleness=1)
    learner = Learner(dropping, GRPO(GRPOConfig()), LearnerSettings(off_policy=stale))
    assert learner._dropout
    trajectories = _stale_batch(model)
    first = DecoupledUpFront(2.0).prepare(trajectories, learner._proximal)
    again = DecoupledUpFront(2.0).prepare(trajectories, learner._proximal)
    assert first == again
    plain = Learner(copy.deepcopy(model), GRPO(GRPOConfig()), LearnerSettings(off_policy=stale))
    assert not plain._dropout
    assert first == DecoupledUpFront(2.0).prepare(trajectories, plain._proximal)


@pytest.mark.parametrize(("cap", "mode"), [(0.5, "truncate"), (2.0, "clip")])
def test_a_cap_below_one_or_an_unknown_mode_is_refused_by_key(cap, mode):
    from agentgym_core.config.errors import ConfigError
    from agentgym_core.config.resolve import validate_dict

    raw = {
        "model": {"path": "m"},
        "env": {"name": "babyai"},
        "trainer": {"max_staleness": 1, "importance_cap": cap, "importance_mode": mode},
    }
    with pytest.raises(ConfigError) as raised:
        validate_dict(raw)
    key = "trainer.importance_cap" if cap < 1 else "trainer.importance_mode"
    assert f"{key}:" in str(raised.value)


def test_recomputed_behaviour_logprobs_go_beside_the_sampled_ones(tiny_model):
    """`recompute_behaviour` writes `behaviour_logprobs`; the sampled `logprobs` stay."""
    from types import SimpleNamespace

    from agentgym_core.run.rollout_step import recompute_behaviour

    model, _ = tiny_model
    trajectories = _stale_batch(model)
    sampled = [list(t.logprobs) for t in trajectories]
    trainer = SimpleNamespace(
        packing="padded",
        row_tokens=None,
        micro_batch_tokens=4096,
        share_prompts=True,
        logprob_chunk_tokens=None,
    )
    root = SimpleNamespace(trainer=trainer, rollout=SimpleNamespace(temperature=1.0))
    recompute_behaviour(model, TrajectoryBatch(trajectories), root)
    for trajectory, before in zip(trajectories, sampled, strict=True):
        assert trajectory.logprobs == before
        alone = copy.deepcopy(trajectory)
        (mb,) = pack([alone], row_tokens=None, micro_batch_tokens=1000)
        with torch.no_grad():
            own = [0.0] + token_logprobs(model.eval(), mb, 1.0)[0][0, :-1].tolist()
        agent = [own[i] * m for i, m in enumerate(trajectory.loss_mask)]
        assert trajectory.behaviour_logprobs == pytest.approx(agent, abs=1e-5)
        assert trajectory.behaviour is trajectory.behaviour_logprobs


@pytest.mark.parametrize("weigh", ["in_pass", "up_front"])
def test_both_corrections_weigh_against_the_behaviour_logprobs_not_the_sampled(tiny_model, weigh):
    """A batch whose recomputed values sit beside garbage sampled ones trains as the batch
    whose sampled values are those recomputed ones."""
    from agentgym_algo_grpo import GRPO, GRPOConfig

    model, _ = tiny_model
    beside = _stale_batch(model)
    for trajectory in beside:
        trajectory.behaviour_logprobs = list(trajectory.logprobs)
        trajectory.logprobs = [-0.5 * m for m in trajectory.loss_mask]  # not what is weighed
    plain = _stale_batch(model)
    stale = OffPolicySettings(max_staleness=1, importance_cap=2.0)
    settings = LearnerSettings(lr=1e-2, off_policy=stale)
    results = []
    for batch in (beside, plain):
        learner = Learner(copy.deepcopy(model), GRPO(GRPOConfig()), settings)
        correction = DecoupledUpFront(2.0) if weigh == "up_front" else None
        results.append(learner.update(TrajectoryBatch(batch), correction))
    got, reference = results
    for key in ("loss", "grad_norm", "importance_weight_mean", "importance_weight_max"):
        assert got[key] == pytest.approx(reference[key], rel=1e-6), key
