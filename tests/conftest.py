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


@pytest.fixture
def cpu_contention():
    """Busy-loop processes on every core for the test's duration: exactness must not need a
    quiet machine (CI shares one)."""
    import os
    import subprocess
    import sys

    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]
    try:
        yield len(loops)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
