"""Packing, log-probability recomputation and the optimizer step of the learner."""

from __future__ import annotations

import random

import pytest
import torch

from agentgym_core.learner.forward import token_logprobs
from agentgym_core.learner.learner import Learner
from agentgym_core.learner.packing import pack
from agentgym_core.learner.scoring import score
from agentgym_core.learner.settings import LearnerSettings, lr_factor
from agentgym_core.types import Trajectory, TrajectoryBatch


def _traj(rng: random.Random, vocab: int, length: int, group: int = 0, reward: float = 0.0):
    ids = [rng.randrange(3, vocab) for _ in range(length)]
    mask = [0] * (length // 2) + [1] * (length - length // 2)
    return Trajectory(
        task_id=group,
        group=group,
        token_ids=ids,
        loss_mask=mask,
        logprobs=[0.0] * length,
        reward=reward,
    )


def test_packed_rows_match_separate_forward_passes(tiny_model):
    model, _ = tiny_model
    rng = random.Random(0)
    vocab = model.config.vocab_size
    trajs = [_traj(rng, vocab, n) for n in (17, 40, 9, 33, 25)]
    batches = pack(trajs, row_tokens=64, micro_batch_tokens=128)
    assert sum(len(mb.input_ids) for mb in batches) < len(trajs)  # several per row
    packed = []
    with torch.no_grad():
        for mb in batches:
            logprobs, _ = token_logprobs(model, mb, 1.0)
            packed.extend(logprobs[mb.mask.bool()].tolist())
        alone = []
        for traj in sorted(trajs, key=lambda t: -len(t.token_ids)):
            (mb,) = pack([traj], row_tokens=None, micro_batch_tokens=1 << 20)
            logprobs, _ = token_logprobs(model, mb, 1.0)
            alone.extend(logprobs[mb.mask.bool()].tolist())
    assert sorted(packed) == pytest.approx(sorted(alone), abs=1e-5)


def test_padding_is_measured():
    rng = random.Random(1)
    trajs = [_traj(rng, 50, n) for n in (10, 10, 20)]
    (mb,) = pack(trajs, row_tokens=20, micro_batch_tokens=1000)
    assert mb.slots == 40 and mb.real_tokens == 40  # 10 + 10 share a row: no padding
    (mb,) = pack([_traj(rng, 50, 5), _traj(rng, 50, 20)], row_tokens=None, micro_batch_tokens=1000)
    assert mb.slots == 40 and mb.real_tokens == 25


def test_constraints_restrict_the_recomputed_distribution(tiny_model):
    model, _ = tiny_model
    traj = _traj(random.Random(2), model.config.vocab_size, 12)
    traj.constraints = {9: (traj.token_ids[9], 5)}
    (mb,) = pack([traj], row_tokens=None, micro_batch_tokens=1000)
    with torch.no_grad():
        logprobs, entropy = token_logprobs(model, mb, 1.0)
    with torch.no_grad():
        logits = model(torch.tensor([traj.token_ids])).logits
    two = torch.log_softmax(logits[0, 8, [traj.token_ids[9], 5]], -1)
    assert float(logprobs[0, 8]) == pytest.approx(float(two[0]), abs=1e-5)
    assert float(entropy[0, 8]) <= torch.log(torch.tensor(2.0)) + 1e-6


def test_update_moves_probability_towards_positive_advantage(tiny_model):
    from agentgym_algo_grpo import GRPO, GRPOConfig

    model, _ = tiny_model
    model = type(model)(model.config)
    model.load_state_dict(tiny_model[0].state_dict())
    rng = random.Random(3)
    good = _traj(rng, model.config.vocab_size, 20, reward=1.0)
    bad = _traj(rng, model.config.vocab_size, 20, reward=0.0)
    batch = TrajectoryBatch([good, bad])
    algorithm = GRPO(GRPOConfig())
    (mb,) = pack([good], row_tokens=None, micro_batch_tokens=1000)
    with torch.no_grad():
        before = token_logprobs(model, mb, 1.0)[0][mb.mask.bool()].sum()
    for traj in batch:
        (single,) = pack([traj], row_tokens=None, micro_batch_tokens=1000)
        with torch.no_grad():
            traj.logprobs = [0.0] + token_logprobs(model, single, 1.0)[0][0, :-1].tolist()
    algorithm.advantages(batch)
    metrics = Learner(model, algorithm, LearnerSettings(lr=1e-2)).update(batch)
    with torch.no_grad():
        after = token_logprobs(model, mb, 1.0)[0][mb.mask.bool()].sum()
    assert after > before
    assert metrics["ratio"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["sampler_logprob_diff"] < 1e-4
    assert metrics["padding_fraction"] == pytest.approx(0.0)


def test_several_optimizer_steps_use_recomputed_old_logprobs(tiny_model):
    from agentgym_algo_grpo import GRPO, GRPOConfig

    model = type(tiny_model[0])(tiny_model[0].config)
    model.load_state_dict(tiny_model[0].state_dict())
    rng = random.Random(4)
    trajs = [_traj(rng, model.config.vocab_size, 16, group=0, reward=r) for r in (1.0, 0.0, 0.0)]
    for traj in trajs:
        traj.logprobs = [-9.0] * len(traj.token_ids)  # a stale sampler: recomputed away
    batch = TrajectoryBatch(trajs)
    algorithm = GRPO(GRPOConfig())
    algorithm.advantages(batch)
    settings = LearnerSettings(lr=1e-2, epochs=2, mini_batches=1)
    metrics = Learner(model, algorithm, settings).update(batch)
    assert metrics["optimizer_steps"] == 2
    assert metrics["sampler_logprob_diff"] > 1.0  # the stale values were noticed ...
    # ... and replaced by the learner's beside the batch: ratios near 1, not exp(lp + 9)
    assert metrics["ratio"] == pytest.approx(1.0, abs=0.5)
    assert metrics["ratio"] != pytest.approx(1.0, abs=1e-6)  # ... and epoch 2 is off-policy
    # the trajectories stay as the rollout wrote them
    assert all(lp == -9.0 for t in trajs for lp in t.logprobs)


def test_lr_schedule():
    warm = LearnerSettings(lr_schedule="linear", warmup_steps=4, total_steps=14)
    assert [lr_factor(u, warm) for u in (0, 3)] == [0.25, 1.0]
    assert lr_factor(9, warm) == pytest.approx(0.5)
    cosine = LearnerSettings(lr_schedule="cosine", total_steps=10)
    assert lr_factor(5, cosine) == pytest.approx(0.5)
    assert lr_factor(3, LearnerSettings()) == 1.0


def test_a_skipped_update_moves_the_schedule_without_a_torch_warning(tiny_model, recwarn):
    """Nothing to train on (every group uniform, say) before any optimizer step."""
    from agentgym_algo_grpo import GRPO, GRPOConfig

    settings = LearnerSettings(lr=1e-2, lr_schedule="linear", warmup_steps=2, total_steps=4)
    learner = Learner(_copy(tiny_model[0]), GRPO(GRPOConfig()), settings)
    assert learner.update(TrajectoryBatch([])) == {"skipped": 1.0, "lr": pytest.approx(5e-3)}
    assert learner.updates == 1
    assert not [w for w in recwarn if "lr_scheduler.step()" in str(w.message)]


def test_every_update_gives_back_the_memory_it_freed(tiny_model, monkeypatch):
    """On a CPU an update's activations, freed, would stay in glibc's arenas (`heap`)."""
    from agentgym_algo_grpo import GRPO, GRPOConfig

    from agentgym_core.learner import learner as learner_module

    calls = []
    monkeypatch.setattr(learner_module, "release_freed_memory", lambda: calls.append(1))
    rng = random.Random(4)
    vocab = tiny_model[0].config.vocab_size
    batch = TrajectoryBatch([_traj(rng, vocab, 12, reward=r) for r in (0.0, 1.0)])
    algorithm = GRPO(GRPOConfig())
    algorithm.advantages(batch)
    Learner(_copy(tiny_model[0]), algorithm, LearnerSettings(lr=1e-3)).update(batch)
    assert calls == [1]


# -- reference log-probs, critics, warm-up --------------------------------------------------------


def _copy(model):
    fresh = type(model)(model.config)
    fresh.load_state_dict(model.state_dict())
    return fresh


def _ppo_batch(vocab: int, seed: int = 5) -> TrajectoryBatch:
    rng = random.Random(seed)
    trajs = [_traj(rng, vocab, n, group=i, reward=float(i % 2)) for i, n in enumerate((14, 18, 11))]
    return TrajectoryBatch(trajs)


def test_score_sets_reference_logprobs_and_values_on_agent_tokens(tiny_model):
    from agentgym_algo_ppo import PPO, PPOConfig

    model = _copy(tiny_model[0])
    learner = Learner(model, PPO(PPOConfig(kl_coef=0.1)), LearnerSettings(), reference=model)
    head = learner.critic.module.head.linear
    torch.nn.init.normal_(head.weight, generator=torch.Generator().manual_seed(0))
    batch = _ppo_batch(model.config.vocab_size)
    score(learner, batch.trajectories)
    for traj in batch:
        with torch.no_grad():
            out = model(torch.tensor([traj.token_ids]), output_hidden_states=True)
            values = head(out.hidden_states[-1][0]).squeeze(-1)
        logp = torch.log_softmax(out.logits[0], -1)
        for i, m in enumerate(traj.loss_mask):
            # token i is predicted (and valued) at position i - 1; nothing off the agent's tokens
            want_ref = float(logp[i - 1, traj.token_ids[i]]) if m else 0.0
            want_value = float(values[i - 1]) if m else 0.0
            assert traj.ref_logprobs[i] == pytest.approx(want_ref, abs=1e-5)
            assert traj.values[i] == pytest.approx(want_value, abs=1e-5)


def _weights(module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _changed(before, module) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


def _ppo_update(learner, batch, algorithm):
    for traj in batch:
        traj.values = traj.ref_logprobs = traj.advantages = traj.returns = None
    score(learner, batch.trajectories)
    algorithm.advantages(batch)
    return learner.update(batch)


def test_critic_warmup_trains_only_the_value_head_first(tiny_model):
    from agentgym_algo_ppo import PPO, PPOConfig

    model = _copy(tiny_model[0])
    algorithm = PPO(PPOConfig(critic_warmup=1, normalize_advantages=False))
    learner = Learner(model, algorithm, LearnerSettings(lr=1e-2))
    batch = _ppo_batch(model.config.vocab_size)
    policy, head = _weights(model), _weights(learner.critic.module)
    first = _ppo_update(learner, batch, algorithm)
    assert first["critic_warmup"] == 1.0 and "grad_norm" not in first
    assert not _changed(policy, model) and _changed(head, learner.critic.module)
    second = _ppo_update(learner, batch, algorithm)
    assert second["critic_warmup"] == 0.0 and _changed(policy, model)
    assert second["value_loss"] < first["value_loss"]  # the head moved towards the returns


def test_value_loss_reaches_the_policy_only_through_a_shared_head(tiny_model):
    from agentgym_algo_ppo import PPO, PPOConfig

    from agentgym_core.learner.critic import Critic, ValueHead

    def policy_after(critic: str, vf_coef: float) -> list[torch.Tensor]:
        model = _copy(tiny_model[0])
        algorithm = PPO(PPOConfig(critic=critic, vf_coef=vf_coef, normalize_advantages=False))
        separate = None
        if critic == "model":
            separate = Critic(ValueHead(model.config.hidden_size), _copy(model).base_model)
        learner = Learner(model, algorithm, LearnerSettings(lr=1e-2), critic=separate)
        # a non-zero head, so the value loss has a gradient beyond the head's own weights
        torch.nn.init.constant_(learner.critic.module.head.linear.weight, 0.1)
        _ppo_update(learner, _ppo_batch(model.config.vocab_size), algorithm)
        return _weights(model)

    def same(a, b):
        return all(torch.allclose(x, y, atol=1e-7) for x, y in zip(a, b, strict=True))

    assert same(policy_after("model", 0.0), policy_after("model", 1.0))
    assert not same(policy_after("head", 0.0), policy_after("head", 1.0))


def test_critic_state_round_trips(tiny_model):
    from agentgym_algo_grpo import GRPO, GRPOConfig
    from agentgym_algo_ppo import PPO, PPOConfig

    algorithm = PPO(PPOConfig())
    learner = Learner(_copy(tiny_model[0]), algorithm, LearnerSettings(lr=1e-2))
    _ppo_update(learner, _ppo_batch(tiny_model[0].config.vocab_size), algorithm)
    state = learner.state()
    restored = Learner(_copy(tiny_model[0]), algorithm, LearnerSettings(lr=1e-2))
    restored.load_state(state)
    assert not _changed(_weights(learner.critic.module), restored.critic.module)
    assert restored.updates == learner.updates == 1
    assert restored.critic.optimizer.state_dict()["state"][0]["step"] == 1
    plain = Learner(_copy(tiny_model[0]), GRPO(GRPOConfig()), LearnerSettings()).state()
    with pytest.raises(ValueError, match="holds no critic"):
        restored.load_state(plain)


def test_outcome_reward_sits_on_the_last_generated_token():
    from agentgym_core.learner.rewards import spread, token_rewards

    # ends with two observation tokens; agent tokens at 1, 2, 4
    traj = Trajectory(
        task_id=0,
        group=0,
        token_ids=list(range(7)),
        loss_mask=[0, 1, 1, 0, 1, 0, 0],
        logprobs=[0, -1.0, -1.0, 0, -1.0, 0, 0],
        ref_logprobs=[0, -1.5, -0.5, 0, -1.0, 0, 0],
        reward=2.0,
    )
    rewards = token_rewards(traj, outcome=traj.reward, kl_coef=0.2)
    assert rewards == pytest.approx([-0.1, 0.1, 2.0])
    assert spread(traj, rewards) == pytest.approx([0, -0.1, 0.1, 0, 2.0, 0, 0])
    traj.ref_logprobs = None
    with pytest.raises(ValueError, match="AlgorithmNeeds.reference"):
        token_rewards(traj, outcome=1.0, kl_coef=0.2)


def _full_vocab_reference(model, mb, temperature):
    """What `token_logprobs` computed before it kept only agent positions: every logit."""
    out = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False)
    logits = out.logits.float()
    logits = logits / temperature
    for (r, c), ids in zip(mb.constrained_at, mb.constrained_ids, strict=True):
        keep = torch.full_like(logits[r, c], float("-inf"))
        keep[list(ids)] = 0.0
        logits[r, c] = logits[r, c] + keep
    logp = torch.log_softmax(logits, -1)
    chosen = logp.gather(2, mb.targets.unsqueeze(2)).squeeze(2)
    entropy = -(logp.exp() * logp.nan_to_num(neginf=0.0)).sum(-1)
    return chosen, entropy


def _constrained_trajectories(vocab: int) -> list[Trajectory]:
    rng = random.Random(7)
    trajs = [_traj(rng, vocab, n) for n in (30, 12, 21, 9)]
    for traj in trajs:  # constrain two agent positions per trajectory, the target among them
        for position in (len(traj.token_ids) - 1, len(traj.token_ids) - 3):
            traj.constraints[position] = tuple(sorted({traj.token_ids[position], 3, 4}))
    return trajs


def _constrained_batch(vocab: int):
    return pack(_constrained_trajectories(vocab), row_tokens=32, micro_batch_tokens=1 << 20)


def test_agent_position_logprobs_equal_the_full_vocabulary_computation(tiny_model):
    model, _ = tiny_model
    (mb,) = _constrained_batch(model.config.vocab_size)
    assert len(mb.input_ids) > 1 and mb.constrained_at
    mask = mb.mask.bool()
    logprobs, entropy = token_logprobs(model, mb, 0.7)
    (logprobs.sum() + entropy.sum()).backward()
    fast = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    chosen, full_entropy = _full_vocab_reference(model, mb, 0.7)
    (chosen[mask].sum() + full_entropy[mask].sum()).backward()
    assert torch.allclose(logprobs[mask], chosen[mask], atol=1e-5)
    assert torch.allclose(entropy[mask], full_entropy[mask], atol=1e-5)
    assert not logprobs[~mask].any() and not entropy[~mask].any()  # 0 off agent tokens
    for name, param in model.named_parameters():
        assert torch.allclose(fast[name], param.grad, atol=1e-5), name
    model.zero_grad()


def test_models_without_logits_to_keep_get_the_same_values(tiny_model):
    model, _ = tiny_model

    class PlainForward(torch.nn.Module):  # a remote-code model whose forward lacks the option
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids, position_ids, use_cache, output_hidden_states):
            return self.inner(
                input_ids=input_ids,
                position_ids=position_ids,
                use_cache=use_cache,
                output_hidden_states=output_hidden_states,
            )

    (mb,) = _constrained_batch(model.config.vocab_size)
    with torch.no_grad():
        fast, _ = token_logprobs(model, mb, 1.0)
        plain, _ = token_logprobs(PlainForward(model), mb, 1.0)
    assert torch.allclose(fast, plain, atol=1e-6)


def test_entropy_carries_gradient_only_when_the_algorithm_uses_it(tiny_model):
    from agentgym_algo_grpo import GRPO, GRPOConfig

    from agentgym_core.learner.learner import policy_forward

    model, _ = tiny_model
    (mb,) = _constrained_batch(model.config.vocab_size)
    assert GRPO(GRPOConfig()).needs.entropy_grad is False
    assert GRPO(GRPOConfig(entropy_coef=0.01)).needs.entropy_grad is True
    logprobs, entropy, _ = policy_forward(model, mb, 1.0, entropy_grad=False)
    assert logprobs.requires_grad and not entropy.requires_grad
    _, entropy, _ = policy_forward(model, mb, 1.0)
    assert entropy.requires_grad


def test_padded_rows_hold_one_trajectory_each_and_give_the_same_logprobs(tiny_model):
    model, _ = tiny_model
    (shared,) = _constrained_batch(model.config.vocab_size)
    trajs = _constrained_trajectories(model.config.vocab_size)
    padded = pack(trajs, row_tokens=None, micro_batch_tokens=60, share_rows=False)
    assert [tuple(mb.input_ids.shape) for mb in padded] == [(2, 30), (2, 12)]  # longest first
    for mb in padded:  # one trajectory per row; positions keep counting through the padding
        assert all(offset == 0 for _, _, offset in mb.placements)
        assert torch.equal(
            mb.position_ids, torch.arange(mb.input_ids.shape[1]).expand_as(mb.input_ids)
        )
    with torch.no_grad():
        by_shared, _ = token_logprobs(model, shared, 1.0)
        expected = {
            i: by_shared[r, o : o + len(trajs[i].token_ids) - 1] for i, r, o in shared.placements
        }
        for mb in padded:
            logprobs, _ = token_logprobs(model, mb, 1.0)
            for index, row, _ in mb.placements:
                n = len(trajs[index].token_ids) - 1
                assert torch.allclose(logprobs[row, :n], expected[index], atol=1e-5)


def test_packing_auto_shares_rows_under_kernels_that_skip_masked_blocks(tiny_model):
    from types import SimpleNamespace

    from agentgym_core.run.runtime import share_rows

    model, _ = tiny_model
    assert model.config._attn_implementation != "flash_attention_2"
    assert share_rows("auto", model) is False
    assert share_rows("shared", model) is True and share_rows("padded", model) is False
    skipping, dense = (
        ("flash_attention_2", "flash_attention_3", "flex_attention"),
        ("sdpa", "sdpa_gqa", "eager"),
    )
    picked = {
        kernel: share_rows(
            "auto", SimpleNamespace(config=SimpleNamespace(_attn_implementation=kernel))
        )
        for kernel in (*skipping, *dense)
    }
    assert picked == {
        **dict.fromkeys(skipping, True),
        **dict.fromkeys(dense, False),  # a dense block-diagonal mask: padded is faster
    }


def test_model_attn_implementation_reaches_the_loaded_model(tiny_model_dir):
    from agentgym_core.config.errors import ConfigError
    from agentgym_core.config.schema import ModelConfig
    from agentgym_core.run.components import load_configured_model

    default, _ = load_configured_model(ModelConfig(path=str(tiny_model_dir)))
    eager, _ = load_configured_model(
        ModelConfig(path=str(tiny_model_dir), attn_implementation="eager")
    )
    sdpa, _ = load_configured_model(
        ModelConfig(path=str(tiny_model_dir), attn_implementation="sdpa")
    )
    assert default.config._attn_implementation == "sdpa_gqa"  # sdpa, without per-head copies
    assert sdpa.config._attn_implementation == "sdpa"
    assert eager.config._attn_implementation == "eager"
    with pytest.raises(ConfigError, match=r"model\.attn_implementation: 'bogus': .*sdpa"):
        load_configured_model(ModelConfig(path=str(tiny_model_dir), attn_implementation="bogus"))
