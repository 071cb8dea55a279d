"""GiGPO advantages against values worked out by hand."""

import math

import pytest
import torch
from agentgym_algo_gigpo import (
    GiGPO,
    GiGPOConfig,
    anchor_states,
    discounted_returns,
    step_advantages,
    turn_spans,
)
from pydantic import ValidationError

from agentgym_core.interfaces import LossInputs
from agentgym_core.plugins import PluginHost
from agentgym_core.types import Termination, Trajectory, TrajectoryBatch, Turn

PROMPT = (7, 8)
R2, R3 = math.sqrt(2), math.sqrt(3)


def _traj(group: int, steps, *, action_tokens: int = 1, prompt=PROMPT) -> Trajectory:
    """Prompt, then per turn `action_tokens` sampled tokens and one observation token.

    `steps` is a list of (observation after the action, reward); the last turn's
    observation is not appended as tokens (as when the episode ends).
    """
    t = Trajectory(task_id=100 + group, group=group, prompt_length=len(prompt))
    t.token_ids, t.loss_mask = list(prompt), [0] * len(prompt)
    for k, (observation, reward) in enumerate(steps):
        t.token_ids += [1] * action_tokens
        t.loss_mask += [1] * action_tokens
        t.turns.append(Turn(f"action {k}", observation, reward, done=reward > 0))
        t.reward += reward
        if k + 1 < len(steps):
            t.token_ids.append(2)
            t.loss_mask.append(0)
    t.logprobs = [0.0] * len(t.token_ids)
    return t


def _group(group: int = 0) -> list[Trajectory]:
    """Three samples of one task; S0 is the reset state, G the goal.

    T1: S0 -> A -> G (reward 1 on turn 2)
    T2: S0 -> B -> A -> G (reward 1 on turn 3)
    T3: S0 -> B -> C -> D (no reward; C is met by T3 alone)
    """
    return [
        _traj(group, [("A", 0.0), ("G", 1.0)]),
        _traj(group, [("B", 0.0), ("A", 0.0), ("G", 1.0)]),
        _traj(group, [("B", 0.0), ("C", 0.0), ("D", 0.0)]),
    ]


def _per_turn(config: GiGPOConfig, group: list[Trajectory]) -> list[list[float]]:
    GiGPO(config).advantages(TrajectoryBatch(group))
    return [[t.advantages[start] for start, _ in turn_spans(t)] for t in group]


def test_discounted_returns_by_hand():
    assert discounted_returns([0.0, 0.0, 1.0], 0.9) == pytest.approx([0.81, 0.9, 1.0])
    assert discounted_returns([1.0, 0.0, 2.0], 0.5) == pytest.approx([1.5, 1.0, 2.0])
    assert discounted_returns([0.0, 1.0], 1.0) == [1.0, 1.0]
    assert discounted_returns([], 0.5) == []


def test_anchor_state_is_the_observation_before_each_action():
    t1, t2, _ = _group()
    reset = ("reset", PROMPT)
    assert anchor_states(t1) == [reset, ("observation", "A")]
    assert anchor_states(t2) == [reset, ("observation", "B"), ("observation", "A")]


def test_the_reset_view_met_again_later_is_the_same_state():
    """With the reset observation kept, `turn left, turn right` back to the start matches it."""
    there_and_back = _traj(0, [("S1", 0.0), ("S0", 0.0), ("G", 1.0)])
    straight = _traj(0, [("G", 1.0)])
    for t in (there_and_back, straight):
        t.first_observation = "S0"
    assert anchor_states(there_and_back) == [
        ("observation", "S0"),
        ("observation", "S1"),
        ("observation", "S0"),
    ]
    assert anchor_states(straight) == [("observation", "S0")]
    # S0 is met 3 times: returns (gamma 0.5) 0.25 at turn 0, 1 at turn 2, 1 for `straight`
    config = GiGPOConfig(omega=1.0, gamma=0.5, scale_by_std=False)
    per_turn = _per_turn(config, [there_and_back, straight])
    episode = [0.0, 0.0]  # both succeed: the episode advantage is 0
    mean = (0.25 + 1.0 + 1.0) / 3
    assert per_turn[0][0] == pytest.approx(episode[0] + 0.25 - mean)
    assert per_turn[0][2] == pytest.approx(episode[0] + 1.0 - mean)
    assert per_turn[1][0] == pytest.approx(episode[1] + 1.0 - mean)
    assert per_turn[0][1] == 0.0  # S1 met once: no sibling to compare with


def test_step_advantages_by_hand():
    # gamma 0.5: returns T1 [0.5, 1], T2 [0.25, 0.5, 1], T3 [0, 0, 0]
    # S0 {0.5, 0.25, 0}: mean 0.25, sample std 0.25 -> +1, 0, -1
    # B {T2: 0.5, T3: 0}: mean 0.25, sample std 0.25 * sqrt 2 -> +1/sqrt 2, -1/sqrt 2
    # A {T1: 1, T2: 1}: equal -> 0, 0;  C {T3: 0}: met once -> 0
    got = step_advantages(_group(), gamma=0.5, std="sample", eps=1e-12)
    want = [[1, 0], [0, 1 / R2, 0], [-1, -1 / R2, 0]]
    for row, expected in zip(got, want, strict=True):
        assert row == pytest.approx(expected, abs=1e-9)


def test_combined_per_turn_advantages_with_std():
    # episode: rewards 1, 1, 0 -> mean 2/3, sample std 1/sqrt 3 -> 1/sqrt 3, 1/sqrt 3, -2/sqrt 3
    config = GiGPOConfig(gamma=0.5, omega=1.0, eps=1e-12)
    got = _per_turn(config, _group())
    e1, e3 = 1 / R3, -2 / R3
    want = [[e1 + 1, e1 + 0], [e1 + 0, e1 + 1 / R2, e1 + 0], [e3 - 1, e3 - 1 / R2, e3 + 0]]
    for row, expected in zip(got, want, strict=True):
        assert row == pytest.approx(expected, abs=1e-9)


def test_combined_per_turn_advantages_mean_only():
    # episode 1/3, 1/3, -2/3; steps S0 +0.25, 0, -0.25 and B +0.25, -0.25, times omega 0.5
    config = GiGPOConfig(gamma=0.5, omega=0.5, scale_by_std=False)
    got = _per_turn(config, _group())
    want = [
        [1 / 3 + 0.125, 1 / 3],
        [1 / 3, 1 / 3 + 0.125, 1 / 3],
        [-2 / 3 - 0.125, -2 / 3 - 0.125, -2 / 3],
    ]
    for row, expected in zip(got, want, strict=True):
        assert row == pytest.approx(expected, abs=1e-12)


def test_gamma_one_makes_every_turn_of_a_success_equal():
    # gamma 1: returns T1 [1, 1], T2 [1, 1, 1], T3 [0, 0, 0]
    # S0 {1, 1, 0} -> 1/3, 1/3, -2/3;  B {1, 0} -> 0.5, -0.5;  A {1, 1} -> 0
    got = step_advantages(_group(), gamma=1.0, std="none", eps=1e-6)
    want = [[1 / 3, 0], [1 / 3, 0.5, 0], [-2 / 3, -0.5, 0]]
    for row, expected in zip(got, want, strict=True):
        assert row == pytest.approx(expected, abs=1e-12)


def test_omega_zero_is_group_normalized_outcome_on_every_turn():
    got = _per_turn(GiGPOConfig(omega=0.0, scale_by_std=False), _group())
    want = [[1 / 3] * 2, [1 / 3] * 3, [-2 / 3] * 3]
    assert [pytest.approx(row) for row in want] == got


def test_each_turn_value_on_its_own_tokens_only():
    t = _traj(0, [("A", 0.0), ("G", 1.0)], action_tokens=3)
    u = _traj(0, [("B", 0.0), ("C", 0.0)], action_tokens=3)
    GiGPO(GiGPOConfig(gamma=0.5, scale_by_std=False)).advantages(TrajectoryBatch([t, u]))
    # episode +-0.5; S0 returns {0.5, 0} -> +-0.25; A and B met once -> 0
    assert t.loss_mask == [0, 0, 1, 1, 1, 0, 1, 1, 1]
    assert t.advantages == [0, 0, 0.75, 0.75, 0.75, 0, 0.5, 0.5, 0.5]
    assert u.advantages == [0, 0, -0.75, -0.75, -0.75, 0, -0.5, -0.5, -0.5]


def test_states_are_never_matched_across_groups():
    # Both tasks meet "X" after their first turn, with different returns from it; within
    # each task "X" is met once, so its step advantage is 0 in both.
    a = [_traj(0, [("X", 0.0), ("G", 1.0)]), _traj(0, [("Y", 0.0), ("Z", 0.0)])]
    b = [_traj(1, [("X", 0.0), ("Q", 0.0)]), _traj(1, [("W", 0.0), ("G", 1.0)])]
    GiGPO(GiGPOConfig(gamma=1.0, scale_by_std=False)).advantages(TrajectoryBatch(a + b))
    # episode +-0.5; S0 returns {1, 0} -> +-0.5 in each task; second turns all met once
    assert [t.advantages[2] for t in a + b] == [1.0, -1.0, -1.0, 1.0]
    assert [t.advantages[4] for t in a + b] == [0.5, -0.5, -0.5, 0.5]


def test_the_same_prompt_in_two_groups_is_two_states():
    a = [_traj(0, [("G", 1.0)]), _traj(0, [("N", 0.0)])]
    b = [_traj(1, [("N", 0.0)]), _traj(1, [("N", 0.0)])]
    GiGPO(GiGPOConfig(gamma=1.0, scale_by_std=False)).advantages(TrajectoryBatch(a + b))
    assert [t.advantages[2] for t in a + b] == [1.0, -1.0, 0.0, 0.0]


def test_a_state_revisited_in_one_trajectory_is_grouped_with_itself():
    # S0 -> A -> A -> G: "A" is met before turns 2 and 3 with returns 0.5 and 1 (gamma 0.5)
    t = _traj(0, [("A", 0.0), ("A", 0.0), ("G", 1.0)])
    u = _traj(0, [("B", 0.0), ("B", 0.0), ("B", 0.0)])
    got = step_advantages([t, u], gamma=0.5, std="none", eps=1e-6)
    assert got[0] == pytest.approx([0.125, -0.25, 0.25])  # S0 {0.25, 0}; A {0.5, 1}
    assert got[1] == pytest.approx([-0.125, 0.0, 0.0])  # B {0, 0}


def test_singleton_groups_after_env_errors():
    alone = _traj(0, [("A", 0.0), ("G", 1.0)])
    broken = _traj(0, [("B", 0.0)])
    broken.termination = Termination.ENV_ERROR
    GiGPO(GiGPOConfig()).advantages(TrajectoryBatch([alone, broken]))
    assert alone.advantages == [0.0] * len(alone.token_ids)
    assert broken.advantages is None


def test_episode_stats_over_turns_weights_long_trajectories():
    # rewards 1, 1, 0 with 2, 3, 3 turns -> counted 1 x5, 0 x3: mean 5/8
    group = _group()
    config = GiGPOConfig(omega=0.0, scale_by_std=False, episode_stats="step")
    assert [a[0] for a in _per_turn(config, group)] == pytest.approx([3 / 8, 3 / 8, -5 / 8])
    std = math.sqrt((5 * (3 / 8) ** 2 + 3 * (5 / 8) ** 2) / 7)
    config = GiGPOConfig(omega=0.0, episode_stats="step", eps=1e-12)
    got = [a[0] for a in _per_turn(config, _group())]
    assert got == pytest.approx([3 / 8 / std, 3 / 8 / std, -5 / 8 / std])


def test_uniform_groups_can_be_dropped():
    same = [_traj(0, [("A", 0.0), ("B", 0.0)]), _traj(0, [("A", 0.0), ("C", 0.0)])]
    # equal rewards, but from S0 one reaches the reward sooner: step advantages differ
    soon = [_traj(1, [("G", 1.0)]), _traj(1, [("N", 0.0), ("G", 1.0)])]
    batch = TrajectoryBatch(same + soon)
    GiGPO(GiGPOConfig(drop_uniform_groups=True, gamma=0.5)).advantages(batch)
    assert [t.advantages is None for t in batch] == [True, True, False, False]
    assert soon[0].advantages[2] > 0 > soon[1].advantages[2]


def test_turns_must_match_runs_of_sampled_tokens():
    t = _traj(0, [("A", 0.0), ("G", 1.0)])
    t.loss_mask[3] = 1  # the observation token between the turns, now "sampled"
    with pytest.raises(ValueError, match="1 runs of sampled tokens for 2 turns"):
        turn_spans(t)


def _inputs(ref=None):
    # token 1: ratio 1.25 with A=+1 -> clipped to 1.2 -> loss -1.2
    # token 2: ratio 1.25 with A=-1 -> min(-1.25, -1.2) = -1.25 -> loss +1.25
    return LossInputs(
        logprobs=torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_(),
        old_logprobs=torch.log(torch.tensor([[0.4, 0.4]])),
        advantages=torch.tensor([[1.0, -1.0]]),
        mask=torch.tensor([[1.0, 1.0]]),
        entropy=torch.tensor([[2.0, 1.0]]),
        normalizer=2.0,
        ref_logprobs=ref,
    )


def test_loss_by_hand():
    loss, metrics = GiGPO(GiGPOConfig()).loss(_inputs())
    assert float(loss.detach()) == pytest.approx((-1.2 + 1.25) / 2)
    assert metrics["clip_fraction"] == pytest.approx(0.5)
    ref = torch.log(torch.tensor([[0.25, 0.25]]))
    with_terms, metrics = GiGPO(GiGPOConfig(kl_coef=0.1, entropy_coef=0.01)).loss(_inputs(ref))
    extra = 0.1 * (math.log(2) - 0.5) - 0.01 * 1.5
    assert float((with_terms - loss).detach()) == pytest.approx(extra)
    assert metrics["kl"] == pytest.approx(math.log(2) - 0.5)


def test_needs():
    assert not GiGPO(GiGPOConfig()).needs.reference
    assert GiGPO(GiGPOConfig(kl_coef=0.05)).needs.reference
    assert GiGPO(GiGPOConfig()).needs.group_size == 2


@pytest.mark.parametrize(
    "bad", [{"gamma": 1.5}, {"gamma": -0.1}, {"omega": -1}, {"eps": 0}, {"episode_stats": "x"}]
)
def test_config_validation(bad):
    with pytest.raises(ValidationError):
        GiGPOConfig(**bad)


def test_every_field_documented():
    assert all(field.description for field in GiGPOConfig.model_fields.values())


def test_registers_through_the_hook():
    import agentgym_algo_gigpo

    host = PluginHost({"gigpo-test": agentgym_algo_gigpo}, load_entry_points=False)
    registration = host.registry.get("algorithm", "gigpo")
    assert registration.config is GiGPOConfig
    algorithm = registration.factory(registration.config.model_validate({"omega": 0.5}))
    assert algorithm.config.omega == 0.5


def test_std_is_sample_by_default_population_on_request():
    # omega 0: episode rewards 1, 1, 0 -> mean 2/3, deviations 1/3, 1/3, -2/3, squares sum 2/3
    # sample std sqrt(1/3) -> 1/sqrt 3, ..., -2/sqrt 3; population std sqrt(2/9) -> 1/sqrt 2, ...
    assert GiGPOConfig().std == "sample"
    sample = [row[0] for row in _per_turn(GiGPOConfig(omega=0.0, eps=1e-12), _group())]
    assert sample == pytest.approx([1 / R3, 1 / R3, -2 / R3])
    config = GiGPOConfig(omega=0.0, eps=1e-12, std="population")
    population = [row[0] for row in _per_turn(config, _group())]
    assert population == pytest.approx([1 / R2, 1 / R2, -R2])


def test_older_scale_by_std_key_still_loads():
    assert GiGPOConfig.model_validate({"scale_by_std": False}).std == "none"
    assert GiGPOConfig.model_validate({"scale_by_std": True}).std == "sample"
    with pytest.raises(ValidationError, match="contradicts std: none"):
        GiGPOConfig.model_validate({"scale_by_std": True, "std": "none"})
