"""PPO's GAE, reward placement and losses against values worked out by hand."""

import pytest
import torch
from agentgym_algo_ppo import PPO, PPOConfig
from agentgym_algo_ppo.loss import gae

from agentgym_core.interfaces import CriticSpec, LossInputs
from agentgym_core.types import Trajectory, TrajectoryBatch

# Three turns: prompt, turn 1 (2 tokens), observation, turn 2 (1 token), observation,
# turn 3 (2 tokens), then a final observation: the sequence ends on a masked token.
THREE_TURNS = (0, 0, 0, 1, 1, 0, 0, 1, 0, 0, 1, 1, 0, 0)
AGENT = [3, 4, 7, 10, 11]


def _episode(reward: float, values: list[float], mask=THREE_TURNS) -> Trajectory:
    n = len(mask)
    full = [0.0] * n
    for i, v in zip([i for i, m in enumerate(mask) if m], values, strict=True):
        full[i] = v
    return Trajectory(
        task_id=0,
        group=0,
        token_ids=list(range(n)),
        loss_mask=list(mask),
        logprobs=[0.0] * n,
        reward=reward,
        values=full,
    )


def test_gae_by_hand():
    # gamma 0.9, lambda 0.8, V = 0.5, 0.6, 0.7, reward 1 on the last token:
    # delta_2 = 1 - 0.7 = 0.3                        A_2 = 0.3
    # delta_1 = 0.9 * 0.7 - 0.6 = 0.03               A_1 = 0.03 + 0.72 * 0.3 = 0.246
    # delta_0 = 0.9 * 0.6 - 0.5 = 0.04               A_0 = 0.04 + 0.72 * 0.246 = 0.21712
    advantages, returns = gae([0.0, 0.0, 1.0], [0.5, 0.6, 0.7], 0.9, 0.8)
    assert advantages == pytest.approx([0.21712, 0.246, 0.3])
    assert returns == pytest.approx([0.71712, 0.846, 1.0])


def test_three_turn_episode_ending_on_an_observation_keeps_its_outcome():
    # gamma = lambda = 1: A_k = (sum of rewards from k) - V_k = 1 - V_k on every agent token.
    # AgentGym-RL would put the reward on the last (observation) token and lose it.
    episode = _episode(1.0, [0.1, 0.2, 0.3, 0.4, 0.5])
    PPO(PPOConfig(gamma=1.0, lam=1.0, normalize_advantages=False)).advantages(
        TrajectoryBatch([episode])
    )
    assert [episode.advantages[i] for i in AGENT] == pytest.approx([0.9, 0.8, 0.7, 0.6, 0.5])
    assert [episode.returns[i] for i in AGENT] == pytest.approx([1.0] * 5)
    assert all(episode.advantages[i] == 0.0 for i in range(14) if i not in AGENT)


def test_observation_tokens_are_bridged_not_discounted():
    # gamma 0.5, V = 0: the reward is discounted once per agent token, whatever the
    # number of observation tokens in between: 0.5^4 .. 0.5^0.
    episode = _episode(1.0, [0.0] * 5)
    PPO(PPOConfig(gamma=0.5, lam=1.0, normalize_advantages=False)).advantages(
        TrajectoryBatch([episode])
    )
    assert [episode.advantages[i] for i in AGENT] == pytest.approx([1 / 16, 1 / 8, 1 / 4, 1 / 2, 1])


def test_kl_penalty_in_the_reward_and_whitening():
    # two agent tokens, V = 0, gamma = lam = 1, kl 0.1 with logp - ref = 1.0 and -1.0:
    # rewards -0.1 and +0.1 + 1 -> A = 1.0, 1.1; the other episode: 0, 0.
    mask = (0, 1, 0, 1)
    won = _episode(1.0, [0.0, 0.0], mask)
    won.logprobs, won.ref_logprobs = [0, -1.0, 0, -2.0], [0, -2.0, 0, -1.0]
    lost = _episode(0.0, [0.0, 0.0], mask)
    lost.ref_logprobs = [0.0] * 4
    batch = TrajectoryBatch([won, lost])
    PPO(PPOConfig(gamma=1.0, lam=1.0, kl_coef=0.1, normalize_advantages=False)).advantages(batch)
    assert [won.advantages[1], won.advantages[3]] == pytest.approx([1.0, 1.1])
    # whitened: values 1.0, 1.1, 0, 0 -> mean 0.525, population std 0.52559...
    PPO(PPOConfig(gamma=1.0, lam=1.0, kl_coef=0.1)).advantages(batch)
    std = ((0.475**2 + 0.575**2 + 2 * 0.525**2) / 4) ** 0.5
    assert won.advantages[3] == pytest.approx(0.575 / std, rel=1e-6)
    assert lost.advantages[1] == pytest.approx(-0.525 / std, rel=1e-6)


def test_advantages_need_the_critics_values():
    episode = _episode(1.0, [0.0] * 5)
    episode.values = None
    with pytest.raises(ValueError, match="AlgorithmNeeds.critic"):
        PPO(PPOConfig()).advantages(TrajectoryBatch([episode]))


def test_needs_follow_the_config():
    needs = PPO(PPOConfig()).needs
    assert needs.critic == CriticSpec() and not needs.reference and needs.group_size == 1
    needs = PPO(
        PPOConfig(critic="model", critic_path="x", critic_lr=1e-3, critic_warmup=3, kl_coef=0.1)
    ).needs
    assert needs.critic == CriticSpec(separate=True, path="x", lr=1e-3, warmup_updates=3)
    assert needs.reference


def _inputs(values, old_values, returns):
    # policy part as in GRPO's test: (-1.2 + 1.25) / 2
    return LossInputs(
        logprobs=torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_(),
        old_logprobs=torch.log(torch.tensor([[0.4, 0.4]])),
        advantages=torch.tensor([[1.0, -1.0]]),
        mask=torch.tensor([[1.0, 1.0]]),
        entropy=torch.zeros(1, 2),
        normalizer=2.0,
        values=torch.tensor([values], requires_grad=True),
        old_values=torch.tensor([old_values]),
        returns=torch.tensor([returns]),
    )


def test_clipped_value_loss_by_hand():
    # token 1: V 0.5, old 0.2 -> clipped to 0.4; (0.5-1)^2 = 0.25 < (0.4-1)^2 = 0.36 -> 0.36
    # token 2: V 1.0, old 0.9 -> inside the clip; (1-0)^2 = 1
    # value loss 0.5 * (0.36 + 1) / 2 = 0.34; total = 0.025 + 0.5 * 0.34
    inputs = _inputs([0.5, 1.0], [0.2, 0.9], [1.0, 0.0])
    loss, metrics = PPO(PPOConfig(value_clip=0.2, vf_coef=0.5)).loss(inputs)
    assert float(loss.detach()) == pytest.approx(0.025 + 0.5 * 0.34, abs=1e-6)
    assert metrics["value_loss"] == pytest.approx(0.34, abs=1e-6)
    assert metrics["value_clip_fraction"] == pytest.approx(0.5)
    loss.backward()
    # the clipped branch has no gradient in V: only token 2 pulls, 0.5 * 0.5 * 2 * (1 - 0) / 2
    assert inputs.values.grad.tolist()[0] == pytest.approx([0.0, 0.25])


def test_unclipped_value_loss_is_plain_mse():
    loss, metrics = PPO(PPOConfig(value_clip=None, vf_coef=1.0)).loss(
        _inputs([0.5, 1.0], [0.2, 0.9], [1.0, 0.0])
    )
    assert metrics["value_loss"] == pytest.approx(0.5 * (0.25 + 1.0) / 2, abs=1e-6)
    assert float(loss.detach()) == pytest.approx(0.025 + 0.3125, abs=1e-6)


def test_config_errors_name_the_conflict():
    with pytest.raises(ValueError, match="critic_warmup needs vf_coef > 0"):
        PPOConfig(critic_warmup=2, vf_coef=0.0)
    with pytest.raises(ValueError, match="set critic: model"):
        PPOConfig(critic_path="runs/critic")
