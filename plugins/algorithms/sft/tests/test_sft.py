"""SFT loss and config against values worked out by hand."""

import pytest
import torch
from agentgym_algo_sft import SFT, SFTConfig
from agentgym_algo_sft.loss import weigh_other_tokens
from pydantic import ValidationError

from agentgym_core.interfaces import OfflineAlgorithm, SequenceInputs
from agentgym_core.types import Trajectory


def _inputs(total_tokens: float) -> SequenceInputs:
    # two trajectories: summed log-probs -2 over 2 agent tokens, -4 over 3
    return SequenceInputs(
        logprobs=torch.tensor([[-2.0], [-4.0]], requires_grad=True),
        tokens=torch.tensor([[2.0], [3.0]]),
        total_examples=2,
        total_tokens=total_tokens,
    )


def test_loss_is_the_token_mean_nll_of_the_step():
    sft = SFT(SFTConfig(files=["x.json"]))
    inputs = _inputs(total_tokens=5.0)
    loss, metrics = sft.sequence_loss(inputs)
    assert float(loss.detach()) == pytest.approx((2 + 4) / 5)
    assert metrics["sequence_nll"] == pytest.approx(3.0)  # (2 + 4) / 2 trajectories
    assert metrics["token_nll"] == pytest.approx(1.2)  # 6 / 5 tokens
    loss.backward()
    assert inputs.logprobs.grad.flatten().tolist() == pytest.approx([-0.2, -0.2])


def test_micro_batch_divides_by_the_whole_steps_tokens():
    # this micro-batch holds 5 of the step's 10 agent tokens: its share of the mean is 6 / 10
    loss, _ = SFT(SFTConfig(files=["x.json"])).sequence_loss(_inputs(total_tokens=10.0))
    assert float(loss.detach()) == pytest.approx(0.6)


def test_protocol_and_needs():
    sft = SFT(SFTConfig(expert={"episodes": 5}))
    assert isinstance(sft, OfflineAlgorithm)
    assert not sft.needs.online and not sft.needs.reference
    assert sft.sequences_per_example == 1 and sft.source_stages() == {}


def test_config_needs_data_and_forbids_unknown_keys():
    with pytest.raises(ValidationError, match="no training data"):
        SFTConfig()
    with pytest.raises(ValidationError, match="episodez"):
        SFTConfig(expert={"episodez": 3})


def test_observation_loss_weighs_every_token_but_the_agents():
    sequence = Trajectory(task_id=0, group=0, token_ids=[5, 6, 7, 8, 9], loss_mask=[0, 0, 1, 1, 0])
    weigh_other_tokens(sequence, 0.1)
    assert sequence.loss_mask == [0.1, 0.1, 1, 1, 0.1]
    assert SFTConfig(files=["x.json"]).observation_loss == 0.0  # agent turns only by default
    for bad in (-0.1, 1.5):
        with pytest.raises(ValidationError, match="observation_loss"):
            SFTConfig(files=["x.json"], observation_loss=bad)
