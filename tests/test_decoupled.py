"""Decoupled PPO for stale rollouts: the truncated behaviour weights, by hand."""

from __future__ import annotations

import math

import pytest

from agentgym_core.learner.decoupled import importance_weights


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


def test_scaled_advantages_give_the_decoupled_objective():
    """min(r wA, clip(r) wA) == w min(rA, clip(r)A) for w >= 0, for either sign of A."""
    for ratio in (0.5, 0.9, 1.1, 1.6):
        for advantage in (-1.5, 0.7):
            for weight in (0.0, 0.4, 2.0):
                clipped = min(max(ratio, 0.8), 1.2)
                folded = min(ratio * weight * advantage, clipped * weight * advantage)
                decoupled = weight * min(ratio * advantage, clipped * advantage)
                assert folded == pytest.approx(decoupled)
