"""The weights that go from the learner to a rollout model of its own (ahead of the learner).

Only what training changes travels: every weight in full fine-tuning, the
adapter alone with LoRA (the frozen base is the same tensors on both sides:
`rollout_copy`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

Weights = dict[str, torch.Tensor]


def snapshot(model: Any) -> Weights:
    """A copy of the weights that training changes: all, or an adapter's alone (LoRA)."""
    state = model.state_dict()
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    if len(trainable) < sum(1 for _ in model.parameters()):
        state = {k: v for k, v in state.items() if k in trainable}
    return {k: v.detach().clone() for k, v in state.items()}


def load_weights(model: Any, weights: Weights) -> None:
    """Load a `snapshot`: every weight, or the trained ones only (the frozen base stays)."""
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if unexpected or (missing and len(weights) == len(model.state_dict())):
        raise ValueError(f"weights do not fit the rollout model: {unexpected or missing}")


def rollout_copy(model: Any) -> Any:
    """A copy of `model` for rollouts ahead of the learner, sharing what training never changes.

    Frozen parameters (a LoRA adapter's base) are the same tensors in both,
    never modified by either; only the trained ones are copied. Full
    fine-tuning copies every weight: the learner changes them all while the
    rollouts play.
    """
    frozen = {id(p): p for p in model.parameters() if not p.requires_grad}
    return copy.deepcopy(model, frozen)
