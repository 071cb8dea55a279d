"""A context longer than a model's learned positions is refused before any rollout."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from transformers import (
    AutoTokenizer,
    GPT2Config,
    GPT2LMHeadModel,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from agentgym_core.config.errors import ConfigError
from agentgym_core.config.load import load_config
from agentgym_core.modeling.tiny import TinyModelConfig, init_model
from agentgym_core.plugins import PluginHost
from agentgym_core.run.components import check_context_fits
from agentgym_core.run.eval_stage import run_eval_stage


def _gpt2(positions: int, vocab: int = 64) -> GPT2LMHeadModel:
    config = GPT2Config(n_positions=positions, n_embd=16, n_layer=1, n_head=2, vocab_size=vocab)
    return GPT2LMHeadModel(config)


def test_learned_positions_refuse_a_longer_context_naming_the_key_and_the_limit():
    check_context_fits(_gpt2(64), 64, "m")  # exactly fits
    with pytest.raises(ConfigError) as error:
        check_context_fits(_gpt2(64), 65, "models/gpt2-tiny")
    (problem,) = error.value.problems
    assert problem.path == "rollout.max_context_tokens"
    assert "64 learned positions" in problem.message
    assert "gpt2" in problem.message and "models/gpt2-tiny" in problem.message


def test_rotary_positions_run_past_max_position_embeddings():
    config = Qwen2Config(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=64,
        max_position_embeddings=64,
    )
    check_context_fits(Qwen2ForCausalLM(config), 4096, "m")


def test_an_evaluation_of_a_gpt2_checkpoint_stops_before_its_first_episode(tmp_path: Path):
    """A GPT-2 with 32 positions under the default 2,048-token context: the config error, not
    an index error mid-episode."""
    texts = ["go to the red ball", "pick up the key"]
    folder = init_model(texts, tmp_path / "m", TinyModelConfig())
    vocab = len(AutoTokenizer.from_pretrained(folder))
    _gpt2(32, vocab).save_pretrained(folder)  # the tiny tokenizer and template, GPT-2 weights
    raw = {
        "run": {"name": "gpt2", "output_dir": str(tmp_path / "run"), "seed": 0},
        "model": {"path": str(folder)},
        "env": {"name": "babyai", "levels": ["GoToObj"]},
        "algorithm": {"name": "grpo"},
        "eval": {"num_tasks": 2, "max_turns": 2},
    }
    path = tmp_path / "gpt2.yaml"
    path.write_text(yaml.safe_dump(raw))
    host = PluginHost()
    resolved = load_config(path, [], host.registry)
    with pytest.raises(ConfigError, match="rollout.max_context_tokens"):
        run_eval_stage(resolved, host, folder)
    fits = ["rollout.max_context_tokens=32", "rollout.max_new_tokens=8"]
    metrics, episodes = run_eval_stage(load_config(path, fits, host.registry), host, folder)
    assert len(episodes) == 2  # past the check: played (each ends on the 32-token budget)
