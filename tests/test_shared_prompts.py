"""A group's prompt computed once in the learner's forward: same values, fewer tokens."""

from __future__ import annotations

import random

import pytest
import torch

from agentgym_core.learner.forward import token_logprobs
from agentgym_core.learner.packing import pack, prompt_groups, unpack
from agentgym_core.types import Trajectory


def _group(rng: random.Random, vocab: int, prompt: list[int], lengths: list[int], group: int):
    """Trajectories starting with `prompt`, each continuing with its own agent and env tokens."""
    trajs = []
    for n in lengths:
        rest = [rng.randrange(3, vocab) for _ in range(n)]
        mask = [1] * (n // 2) + [0] * 2 + [1] * (n - n // 2 - 2)  # two turns, an env reply between
        traj = Trajectory(
            task_id=group,
            group=group,
            token_ids=prompt + rest,
            loss_mask=[0] * len(prompt) + mask,
            logprobs=[0.0] * (len(prompt) + n),
            reward=float(n % 3),
        )
        traj.advantages = [0.0] * len(prompt) + [rng.uniform(-1, 1)] * n
        position = len(prompt) + n - 1  # a constrained agent token, its target among the ids
        traj.constraints[position] = tuple(sorted({traj.token_ids[position], 3, 4}))
        trajs.append(traj)
    return trajs


def _batch(vocab: int) -> list[Trajectory]:
    rng = random.Random(3)
    long_prompt = [rng.randrange(3, vocab) for _ in range(40)]
    short_prompt = [rng.randrange(3, vocab) for _ in range(15)]
    lone = _group(rng, vocab, [rng.randrange(3, vocab) for _ in range(20)], [9], group=2)
    return (
        _group(rng, vocab, long_prompt, [8, 13, 6, 11], group=0)
        + lone
        + _group(rng, vocab, short_prompt, [7, 10, 12], group=1)
    )


def _per_trajectory(model, batches, trajs) -> dict[int, list[float]]:
    values = {}
    for mb in batches:
        logprobs, _ = token_logprobs(model, mb, 0.8)
        values.update(unpack(mb, logprobs, trajs))
    return values


def _loss_gradients(model, batches) -> dict[str, torch.Tensor]:
    model.zero_grad()
    for mb in batches:
        logprobs, entropy = token_logprobs(model, mb, 0.8)
        (-(logprobs * mb.advantages).sum() - 0.1 * entropy.sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    return grads


def test_prompt_groups_share_all_of_a_prompt_but_its_last_token():
    trajs = _batch(100)
    assert prompt_groups(trajs) == [
        ([0, 1, 2, 3], 39),  # 40 prompt tokens; the last stays in each row
        ([4], 0),  # alone: nothing to share
        ([5, 6, 7], 14),
    ]
    # the same tokens with the agent's turn starting one token earlier is another prompt
    early = Trajectory(
        task_id=0,
        group=0,
        token_ids=list(trajs[0].token_ids),
        loss_mask=[0] * 39 + [1] * (len(trajs[0].token_ids) - 39),
    )
    assert prompt_groups([trajs[0], early, trajs[1]]) == [([0, 2], 39), ([1], 0)]


def _packs(trajs, micro_batch_tokens=1 << 20):
    shape = dict(row_tokens=None, micro_batch_tokens=micro_batch_tokens, share_rows=False)
    return pack(trajs, **shape), pack(trajs, share_prompts=True, **shape)


def test_shared_prompts_give_the_same_logprobs_and_gradients(tiny_model):
    model, _ = tiny_model
    trajs = _batch(model.config.vocab_size)
    whole, shared = _packs(trajs)
    assert all(mb.prefixes is None for mb in whole)
    # 39 + 14 prompt tokens are computed once instead of 4 and 3 times
    assert sum(mb.real_tokens for mb in whole) - sum(mb.real_tokens for mb in shared) == (
        3 * 39 + 2 * 14
    )
    assert sum(len(mb.constrained_at) for mb in shared) == len(trajs)
    with torch.no_grad():
        expected = _per_trajectory(model, whole, trajs)
        got = _per_trajectory(model, shared, trajs)
    assert sorted(got) == list(range(len(trajs)))
    for index, traj in enumerate(trajs):
        agent = [i for i, m in enumerate(traj.loss_mask) if m]
        assert all(got[index][i] < 0 for i in agent)  # every agent token was read back
        assert got[index] == pytest.approx(expected[index], abs=1e-5), index
    expected_grads = _loss_gradients(model, whole)
    for name, grad in _loss_gradients(model, shared).items():
        assert torch.allclose(grad, expected_grads[name], atol=1e-5), name


def test_a_group_split_across_micro_batches_still_gets_its_prompt(tiny_model):
    model, _ = tiny_model
    trajs = _batch(model.config.vocab_size)
    whole, shared = _packs(trajs, micro_batch_tokens=60)
    assert len(shared) > 2
    with torch.no_grad():
        expected = _per_trajectory(model, whole, trajs)
        got = _per_trajectory(model, shared, trajs)
    for index in range(len(trajs)):
        assert got[index] == pytest.approx(expected[index], abs=1e-5), index


def test_eager_attention_gets_the_same_values(tiny_model):
    model, _ = tiny_model
    trajs = _batch(model.config.vocab_size)
    _, (shared,) = _packs(trajs)
    with torch.no_grad():
        sdpa, _ = token_logprobs(model, shared, 1.0)
        before = model.config._attn_implementation
        model.set_attn_implementation("eager")
        try:
            eager, _ = token_logprobs(model, shared, 1.0)
        finally:
            model.set_attn_implementation(before)
    mask = shared.mask.bool()
    assert torch.allclose(eager[mask], sdpa[mask], atol=1e-5)


def test_each_row_holds_its_tokens_after_the_shared_prompt():
    trajs = _batch(100)
    _, (mb,) = _packs(trajs)
    shared = {i: n for members, n in prompt_groups(trajs) for i in members}
    prefixes = mb.prefixes
    assert sorted(prefixes.lengths.tolist()) == [0, 14, 39]  # each once; the lone row: empty
    for index, row, offset in mb.placements:
        traj, start = trajs[index], shared[index]
        assert offset == -start
        n = len(traj.token_ids) - start
        assert mb.input_ids[row, :n].tolist() == traj.token_ids[start:]
        assert mb.position_ids[row, :n].tolist() == list(range(start, start + n))
        prompt = prefixes.of_row[row]
        assert prefixes.input_ids[prompt, :start].tolist() == traj.token_ids[:start]
        keys = prefixes.key_mask(mb.input_ids.shape[1])[row]
        assert keys[: prefixes.input_ids.shape[1]].sum() == start  # its own prompt, no padding


def test_shared_prompts_need_one_trajectory_per_row():
    with pytest.raises(ValueError, match="share_rows=False"):
        pack(_batch(100), row_tokens=None, micro_batch_tokens=1 << 20, share_prompts=True)


def _copy(model):
    fresh = type(model)(model.config)
    fresh.load_state_dict(model.state_dict())
    return fresh


@pytest.mark.parametrize("critic", ["head", "model"])
def test_a_ppo_update_with_a_reference_and_critic_is_the_same_with_shared_prompts(
    tiny_model, critic
):
    from agentgym_algo_ppo import PPO, PPOConfig

    from agentgym_core.learner.critic import Critic, ValueHead
    from agentgym_core.learner.learner import Learner
    from agentgym_core.learner.scoring import score
    from agentgym_core.learner.settings import LearnerSettings
    from agentgym_core.types import TrajectoryBatch

    def update(share_prompts: bool):
        model = _copy(tiny_model[0])
        algorithm = PPO(PPOConfig(critic=critic, kl_coef=0.1, normalize_advantages=False))
        separate = None
        if critic == "model":
            separate = Critic(ValueHead(model.config.hidden_size), _copy(model).base_model)
        settings = LearnerSettings(lr=1e-2, share_rows=False, share_prompts=share_prompts)
        learner = Learner(
            model, algorithm, settings, reference=_copy(tiny_model[0]), critic=separate
        )
        torch.nn.init.constant_(learner.critic.module.head.linear.weight, 0.1)
        batch = TrajectoryBatch(_batch(model.config.vocab_size))
        score(learner, batch.trajectories)
        algorithm.advantages(batch)
        metrics = learner.update(batch)
        scores = [(t.ref_logprobs, t.values) for t in batch]
        weights = [p.detach() for p in [*model.parameters(), *learner.critic.module.parameters()]]
        return metrics, scores, weights

    whole, shared = update(False), update(True)
    for (ref_a, values_a), (ref_b, values_b) in zip(whole[1], shared[1], strict=True):
        assert ref_b == pytest.approx(ref_a, abs=1e-5)
        assert values_b == pytest.approx(values_a, abs=1e-5)
    for key in ("loss", "value_loss", "grad_norm", "critic_grad_norm"):
        assert shared[0][key] == pytest.approx(whole[0][key], rel=1e-4, abs=1e-6), key
    # one AdamW step of lr 1e-2 moves weights by up to 1e-2; float noise in the gradients
    # moves them apart by up to about 1e-4 (Adam scales tiny gradients up)
    start = [p.detach() for p in _copy(tiny_model[0]).parameters()]
    assert max(float((a - b).abs().max()) for a, b in zip(whole[2], start, strict=False)) > 5e-3
    for a, b in zip(whole[2], shared[2], strict=True):
        assert (a - b).abs().max() < 1e-3, float((a - b).abs().max())


def test_share_prompts_auto_is_on_only_where_it_is_supported(tiny_model):
    from agentgym_core.config.errors import ConfigError
    from agentgym_core.run.runtime import share_prompts

    model, _ = tiny_model
    assert model.config._attn_implementation == "sdpa"
    assert share_prompts("auto", model, rows_shared=False) is True
    assert share_prompts("auto", model, rows_shared=True) is False
    assert share_prompts(False, model, rows_shared=False) is False
    flash = type(
        "Model", (), {"config": type("Config", (), {"_attn_implementation": "flash_attention_2"})()}
    )()
    assert share_prompts("auto", flash, rows_shared=False) is False
    with pytest.raises(ConfigError, match=r"trainer\.share_prompts: .*flash_attention_2"):
        share_prompts(True, flash, rows_shared=False)
    with pytest.raises(ConfigError, match=r"trainer\.packing padded"):
        share_prompts(True, model, rows_shared=True)


def test_micro_batches_that_keep_whole_prompts_stay_within_the_token_budget():
    """Rows laid out whole (sharing saved too little) are split again under the budget."""
    for seed in range(20):
        rng = random.Random(seed)
        trajs = []
        for group in range(rng.randint(2, 6)):
            prompt = [rng.randrange(3, 90) for _ in range(rng.randint(5, 60))]
            trajs += _group(rng, 90, prompt, [rng.randint(20, 120) for _ in range(4)], group)
        batches = pack(
            trajs, row_tokens=None, micro_batch_tokens=400, share_rows=False, share_prompts=True
        )
        assert sorted(i for mb in batches for i, _, _ in mb.placements) == list(range(len(trajs)))
        for mb in batches:
            if mb.prefixes is None and len(mb.input_ids) > 1:
                assert mb.slots <= 400, (seed, mb.slots)
