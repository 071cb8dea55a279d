"""Shared rows (several trajectories per row) score like padded rows under every kernel.

A shared row's position ids restart at 0 for each trajectory, and transformers
builds the block-diagonal mask from them (`masking_utils.find_packed_sequence_indices`)
for eager, sdpa (and agentgym's sdpa_gqa, which takes sdpa's masks) and
flex_attention alike. These tests pin that: the log-probabilities and the gradients
of a loss on them equal those of one trajectory per row, and no trajectory's values
move when a neighbour in its row changes. The `cuda` cases are marked `gpu`
(`make test-gpu`).
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from devices import DEVICES
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentgym_core.learner.forward import token_logprobs
from agentgym_core.learner.packing import MicroBatch, pack
from agentgym_core.modeling.attention import register
from agentgym_core.types import Trajectory

VOCAB = 300
KERNELS = ["eager", "sdpa", "sdpa_gqa", "flex_attention"]
TOLERANCE = {"cpu": 1e-5, "cuda": 1e-4}
"""float32 on both; a GPU's kernels pick their reduction order by shape."""


def _trajectory(rng: random.Random, turns: int) -> Trajectory:
    """A prompt, then `turns` of a sampled action (trained) and an observation."""
    tokens = [rng.randrange(3, VOCAB) for _ in range(rng.randint(5, 9))]
    mask = [0] * len(tokens)
    for _ in range(turns):
        action, observation = rng.randint(2, 4), rng.randint(3, 6)
        tokens += [rng.randrange(3, VOCAB) for _ in range(action + observation)]
        mask += [1] * action + [0] * observation
    advantages = [rng.uniform(-1, 1) * m for m in mask]
    return Trajectory(
        task_id=0, group=0, token_ids=tokens, loss_mask=mask, logprobs=[0.0] * len(tokens),
        advantages=advantages,
    )  # fmt: skip


def _trajectories() -> list[Trajectory]:
    rng = random.Random(3)
    return [_trajectory(rng, turns) for turns in (4, 1, 3, 2, 1, 3, 2)]


def _shared(trajectories: list[Trajectory]) -> list[MicroBatch]:
    batches = pack(trajectories, row_tokens=56, micro_batch_tokens=4096)
    assert len(batches) == 1 and any(
        len({r for _, r, _ in b.placements}) < len(b.placements) for b in batches
    )  # several trajectories to a row
    return batches


def _padded(trajectories: list[Trajectory]) -> list[MicroBatch]:
    return pack(trajectories, row_tokens=None, micro_batch_tokens=4096, share_rows=False)


_WEIGHTS: dict[str, torch.Tensor] = {}


def _model(kernel: str, device: str) -> Qwen2ForCausalLM:
    """A tiny grouped-query Qwen2 in float32, the same weights for every kernel."""
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    if not _WEIGHTS:  # a fresh init's near-uniform attention would hide a wrong mask
        for name, weight in model.state_dict().items():
            _WEIGHTS[name] = weight + 0.3 * torch.randn(weight.shape)
    model.load_state_dict(_WEIGHTS)
    if kernel == "sdpa_gqa":
        register()
    model.set_attn_implementation(kernel)
    return model.to(device)


def _by_trajectory(
    model: Qwen2ForCausalLM, batches: list[MicroBatch], trajectories: list[Trajectory]
) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """Each trajectory's log-probabilities at the positions predicting its tokens 1..n-1,
    and a policy-gradient loss on them (advantage-weighted, per agent token)."""
    out, loss = {}, torch.zeros(())
    agent_tokens = sum(int(b.mask.sum()) for b in batches)
    for batch in batches:
        logprobs, _ = token_logprobs(model, batch, 1.0)
        advantages = batch.advantages.to(logprobs.device)
        loss = loss + -(logprobs * advantages).sum().cpu() / agent_tokens
        for index, row, offset in batch.placements:
            n = len(trajectories[index].token_ids)
            out[index] = logprobs[row, offset : offset + n - 1].detach().cpu()
    return out, loss


def _gradients(model: Qwen2ForCausalLM) -> torch.Tensor:
    return torch.cat([p.grad.flatten().cpu() for p in model.parameters()])


def _needs_flex_backward(kernel: str, device: str) -> None:
    if kernel != "flex_attention":
        return
    from torch.nn.attention.flex_attention import flex_attention

    query = torch.zeros(1, 1, 16, 16, device=device, requires_grad=True)
    try:
        flex_attention(query, query, query)
    except NotImplementedError as error:  # torch 2.13: "does not support backward on CPU"
        pytest.skip(f"flex_attention has no backward pass on {device} in this torch: {error}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_shared_rows_give_the_padded_rows_logprobs(kernel, device):
    trajectories = _trajectories()
    model = _model(kernel, device).eval()
    with torch.no_grad():
        shared, _ = _by_trajectory(model, _shared(trajectories), trajectories)
        padded, _ = _by_trajectory(model, _padded(trajectories), trajectories)
    assert set(shared) == set(padded) == set(range(len(trajectories)))
    for index in padded:
        torch.testing.assert_close(shared[index], padded[index], rtol=0, atol=TOLERANCE[device])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_shared_rows_give_the_padded_rows_gradients(kernel, device):
    _needs_flex_backward(kernel, device)
    trajectories = _trajectories()
    gradients = []
    for layout in (_shared, _padded):
        model = _model(kernel, device).train()
        _, loss = _by_trajectory(model, layout(trajectories), trajectories)
        loss.backward()
        gradients.append(_gradients(model))
    shared, padded = gradients
    assert padded.abs().max() > 1e-2  # a loss that moves the weights
    torch.testing.assert_close(shared, padded, rtol=0, atol=TOLERANCE[device])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_no_trajectory_sees_its_row_neighbours(kernel, device):
    trajectories = _trajectories()
    (batch,) = _shared(trajectories)
    placed = {index: (row, offset) for index, row, offset in batch.placements}
    changed, later = next(  # a trajectory with a neighbour after it: the one that could see it
        (i, [j for j in placed if placed[j][0] == row and placed[j][1] > offset])
        for i, (row, offset) in placed.items()
        if any(placed[j][0] == row and placed[j][1] > offset for j in placed)
    )
    rng = random.Random(11)
    tokens = [rng.randrange(3, VOCAB) for _ in trajectories[changed].token_ids]
    other = list(trajectories)
    other[changed] = dataclasses.replace(trajectories[changed], token_ids=tokens)
    model = _model(kernel, device).eval()
    with torch.no_grad():
        before, _ = _by_trajectory(model, _shared(trajectories), trajectories)
        after, _ = _by_trajectory(model, _shared(other), other)
    assert not torch.allclose(before[changed], after[changed], atol=1e-2)
    for index in later:
        torch.testing.assert_close(before[index], after[index], rtol=0, atol=1e-6)
