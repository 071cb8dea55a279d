"""Shared fixtures: tiny from-scratch models with two different chat templates."""

from __future__ import annotations

import pytest
from colour_env import ColourEnv


def corpus():
    env = ColourEnv()
    texts = [env.instruction()]
    for task in range(60):
        texts.append(env.reset(task))
        texts.extend(env.valid_actions())
        texts.append("You did go to red ball.")
    return texts * 3


@pytest.fixture(scope="session", params=["chatml", "llama3"])
def tiny_model(request, tmp_path_factory):
    """(model, tokenizer) of a freshly built tiny model, once per chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentgym_core.modeling.tiny import TinyModelConfig, init_model

    out = tmp_path_factory.mktemp(f"tiny-{request.param}")
    init_model(corpus(), out, TinyModelConfig(chat_template=request.param, vocab_size=400))
    return AutoModelForCausalLM.from_pretrained(out), AutoTokenizer.from_pretrained(out)
