"""Without vLLM installed (the default venv) the plugin still registers and says what to do."""

from __future__ import annotations

import importlib.util

import pytest

from agentgym_core.config.errors import ConfigError

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is not None, reason="vLLM is installed in this venv"
)


def test_registered_without_vllm_and_building_it_names_the_install(agentgym_host, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    registration = agentgym_host.registry.get("policy", "vllm")
    assert registration.distribution == "agentgym-policy-vllm"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    with pytest.raises(ConfigError, match=r"agentgym-policy-vllm\[cpu\]"):
        registration.factory(registration.config(), model=model, tokenizer=tokenizer)
