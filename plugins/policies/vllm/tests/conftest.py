"""A tiny model vLLM's CPU kernels accept, one vLLM engine shared by the tests, and SmolLM2
with a checkpoint generation_config that samples otherwise.

Starting vLLM costs tens of seconds (imports, profiling, KV cache), so tests
share one policy; a test that syncs other weights into it restores the
fixture's weights afterwards.
"""

from __future__ import annotations

import json

import pytest

SAMPLING_DEFAULTS = {
    "do_sample": True,
    "temperature": 0.3,
    "top_k": 5,
    "top_p": 0.5,
    "repetition_penalty": 1.3,
}
"""What a real checkpoint's generation_config.json may set; none of it is the learner's."""


@pytest.fixture(scope="session")
def smollm2_sampling_dir(smollm2_dir, tmp_path_factory):
    """SmolLM2-135M-Instruct whose generation_config.json sets `SAMPLING_DEFAULTS`.

    The other files are links to the fetched model's (no copy of its weights).
    """
    out = tmp_path_factory.mktemp("smollm2-sampling")
    for path in smollm2_dir.iterdir():
        if path.name != "generation_config.json":
            (out / path.name).symlink_to(path.resolve())
    config = json.loads((smollm2_dir / "generation_config.json").read_text())
    (out / "generation_config.json").write_text(json.dumps(config | SAMPLING_DEFAULTS))
    return out


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
