"""A tiny model vLLM's CPU kernels accept, and one vLLM engine shared by the module's tests.

Starting vLLM costs tens of seconds (imports, profiling, KV cache), so tests
share one policy; a test that syncs other weights into it restores the
fixture's weights afterwards.
"""

from __future__ import annotations

import pytest

LEVELS = ["GoToObj", "GoToLocal", "PickupDist"]


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory):
    """A from-scratch Qwen2 model with head_dim 32 and sharp next-token distributions.

    vLLM's CPU attention takes head sizes of 32 and up (the default tiny model
    has 16). A fresh init is nearly uniform, where two correct kernels break
    argmax ties differently; seeded noise on the weights makes the model
    decisive, so greedy parity tests the implementation, not rounding.
    """
    import torch
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv
    from transformers import AutoModelForCausalLM

    from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model

    env = BabyAIEnv(BabyAIConfig(levels=LEVELS))
    texts = env_corpus(env, env.tasks("train")[:60], max_turns=4)
    env.close()
    out = tmp_path_factory.mktemp("vllm-tiny")
    init_model(texts, out, TinyModelConfig(num_heads=2, num_kv_heads=1, vocab_size=400))
    model = AutoModelForCausalLM.from_pretrained(out)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.5 * torch.randn(parameter.shape, generator=generator))
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def vllm_policy_session(vllm_model_dir):
    """(policy, model, tokenizer): one vLLM engine for the session, loaded from the model folder."""
    from agentgym_policy_vllm import VLLMPolicy, VLLMPolicyConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(vllm_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(vllm_model_dir)
    config = VLLMPolicyConfig(kv_cache_gib=0.25, enforce_eager=True, max_num_seqs=64)
    policy = VLLMPolicy(config, model=model, tokenizer=tokenizer)
    yield policy, model, tokenizer
    policy.close()


@pytest.fixture
def vllm_policy(vllm_policy_session):
    """The session's policy; whatever a test synced into it is replaced by the folder's weights."""
    policy, model, tokenizer = vllm_policy_session
    yield policy, model, tokenizer
    policy.sync_weights(model)
