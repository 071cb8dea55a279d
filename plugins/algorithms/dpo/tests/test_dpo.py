"""DPO loss, metrics and pairing against values worked out by hand."""

import math

import pytest
import torch
from agentgym_algo_dpo import DPO, DPOConfig
from agentgym_algo_dpo.loss import success_failure_pairs
from pydantic import ValidationError

from agentgym_core.interfaces import OfflineAlgorithm, SequenceInputs
from agentgym_core.types import Termination, Trajectory


def _inputs(total_examples=2):
    # pair 1: chosen  log pi -3 vs ref -4 -> reward  0.1 * 1    =  0.1
    #         rejected log pi -5 vs ref -4 -> reward  0.1 * -1   = -0.1   z =  0.2
    # pair 2: chosen  log pi -2 vs ref -1.5 -> reward -0.05
    #         rejected log pi -2 vs ref -2.5 -> reward  0.05              z = -0.1
    return SequenceInputs(
        logprobs=torch.tensor([[-3.0, -5.0], [-2.0, -2.0]], requires_grad=True),
        tokens=torch.tensor([[4.0, 6.0], [2.0, 2.0]]),
        total_examples=total_examples,
        total_tokens=14.0,
        ref_logprobs=torch.tensor([[-4.0, -4.0], [-1.5, -2.5]]),
    )


def test_loss_and_metrics_by_hand():
    inputs = _inputs()
    loss, metrics = DPO(DPOConfig(beta=0.1, pairs_from="x")).sequence_loss(inputs)
    # -log sigmoid(z) = log(1 + exp(-z))
    want = (math.log(1 + math.exp(-0.2)) + math.log(1 + math.exp(0.1))) / 2
    assert float(loss.detach()) == pytest.approx(want)
    assert float(loss.detach()) == pytest.approx(0.6712678, abs=1e-6)
    assert metrics["reward_chosen"] == pytest.approx((0.1 - 0.05) / 2)
    assert metrics["reward_rejected"] == pytest.approx((-0.1 + 0.05) / 2)
    assert metrics["reward_margin"] == pytest.approx((0.2 - 0.1) / 2)
    assert metrics["reward_accuracy"] == pytest.approx(0.5)
    assert metrics["logp_chosen"] == pytest.approx(-2.5)
    assert metrics["logp_rejected"] == pytest.approx(-3.5)


def test_gradient_raises_chosen_and_lowers_rejected():
    inputs = _inputs()
    loss, _ = DPO(DPOConfig(beta=0.1, pairs_from="x")).sequence_loss(inputs)
    loss.backward()
    # d loss / d log pi(chosen) = -beta * sigmoid(-z) / pairs; rejected gets the opposite sign
    g1 = 0.1 / (1 + math.exp(0.2)) / 2
    g2 = 0.1 / (1 + math.exp(-0.1)) / 2
    assert inputs.logprobs.grad.tolist() == [
        pytest.approx([-g1, g1]),
        pytest.approx([-g2, g2]),
    ]


def test_micro_batch_divides_by_the_steps_pairs():
    half, _ = DPO(DPOConfig(pairs_from="x")).sequence_loss(_inputs(total_examples=4))
    full, _ = DPO(DPOConfig(pairs_from="x")).sequence_loss(_inputs(total_examples=2))
    assert float(half.detach()) == pytest.approx(float(full.detach()) / 2)


def test_label_smoothing_by_hand():
    inputs = _inputs()
    inputs.logprobs, inputs.ref_logprobs = inputs.logprobs[:1], inputs.ref_logprobs[:1]
    inputs.total_examples = 1
    loss, _ = DPO(DPOConfig(beta=0.1, label_smoothing=0.1, pairs_from="x")).sequence_loss(inputs)
    want = 0.9 * math.log(1 + math.exp(-0.2)) + 0.1 * math.log(1 + math.exp(0.2))
    assert float(loss.detach()) == pytest.approx(want)


def test_policy_equal_to_reference_gives_log_2():
    inputs = _inputs()
    inputs.ref_logprobs = inputs.logprobs.detach().clone()
    loss, metrics = DPO(DPOConfig(pairs_from="x")).sequence_loss(inputs)
    assert float(loss.detach()) == pytest.approx(math.log(2))
    assert metrics["reward_margin"] == 0.0


def _traj(task, success, termination=Termination.DONE, tokens=2):
    return Trajectory(
        task_id=task,
        group=0,
        token_ids=[1] * (tokens + 1),
        loss_mask=[0] + [1] * tokens,
        logprobs=[0.0] * (tokens + 1),
        success=success,
        termination=termination,
    )


def test_pairs_are_success_and_failure_of_the_same_task():
    trajs = [
        _traj(1, True),
        _traj(1, False),
        _traj(1, False),
        _traj(1, True),
        _traj(1, True),
        _traj(2, True),
        _traj(2, True),  # no failure: no pair
        _traj(3, False),
        _traj(3, True, Termination.ENV_ERROR),  # env error excluded
        _traj(4, True, tokens=0),
        _traj(4, False),  # no agent tokens: excluded
        _traj(5, False),
        _traj(5, True),
    ]
    pairs = success_failure_pairs(trajs, max_per_task=4, seed=0)
    assert [(c.task_id, r.task_id) for c, r in pairs] == [(1, 1), (1, 1), (5, 5)]
    assert all(c.success and not r.success for c, r in pairs)
    used = [id(t) for pair in pairs for t in pair]
    assert len(used) == len(set(used))  # no trajectory in two pairs
    assert len(success_failure_pairs(trajs, max_per_task=1, seed=0)) == 2


def test_protocol_needs_and_sources():
    dpo = DPO(DPOConfig(pairs_from="sample"))
    assert isinstance(dpo, OfflineAlgorithm)
    assert not dpo.needs.online and dpo.needs.reference
    assert dpo.sequences_per_example == 2
    assert dpo.source_stages() == {"pairs_from": "sample"}
    assert DPO(DPOConfig(pairs_files=["p.json"])).source_stages() == {}


def test_config_needs_pairs():
    with pytest.raises(ValidationError, match="no preference pairs"):
        DPOConfig()
    with pytest.raises(ValidationError, match="label_smoothing"):
        DPOConfig(pairs_from="x", label_smoothing=0.5)
