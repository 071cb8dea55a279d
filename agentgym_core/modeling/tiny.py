"""Small from-scratch models, so an agent can be trained with no model download.

`init_model` trains a tokenizer on the environment's own text (`env_corpus`),
builds a Qwen2-architecture causal LM sized by `TinyModelConfig`, and saves
both with `save_pretrained`: the folder loads with plain `AutoModelForCausalLM`
and `AutoTokenizer`, like any checkpoint a user would point `model.path` at.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentgym_core.interfaces import Environment
from agentgym_core.modeling.tokenizer import CHAT_FORMATS, ChatTemplateName, train_tokenizer
from agentgym_core.types import TaskId


class TinyModelConfig(BaseModel):
    """Size and tokenizer of a from-scratch Qwen2-architecture model."""

    model_config = ConfigDict(extra="forbid")

    hidden_size: int = Field(64, gt=0, description="Width of the residual stream.")
    num_layers: int = Field(2, gt=0, description="Number of transformer decoder layers.")
    num_heads: int = Field(4, gt=0, description="Attention (query) heads; divides hidden_size.")
    num_kv_heads: int = Field(
        2, gt=0, description="Key/value heads (grouped-query attention); divides num_heads."
    )
    intermediate_size: int = Field(128, gt=0, description="Hidden width of the SwiGLU MLP.")
    max_position_embeddings: int = Field(
        2048, gt=0, description="Longest sequence (prompt plus all turns) the model is built for."
    )
    vocab_size: int = Field(
        1024,
        gt=0,
        description="Upper bound on the trained tokenizer's vocabulary; the model uses the "
        "tokenizer's actual length, which a small corpus may make smaller.",
    )
    chat_template: ChatTemplateName = Field(
        "chatml",
        description="Chat template and special tokens of the tokenizer: agentgym's chatml or "
        "llama3, or a model family's own (qwen2_5, qwen3, llama3_1, llama3_2, mistral, gemma2, "
        "gemma3, phi4, deepseek_r1_distill; docs/models.md).",
    )
    seed: int = Field(0, description="Seed of the weight initialization; same seed, same weights.")
    tie_word_embeddings: bool = Field(
        True, description="Share the input embedding and output projection (halves vocab params)."
    )

    @model_validator(mode="after")
    def _heads_divide(self) -> TinyModelConfig:
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be divisible by num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be divisible by num_kv_heads")
        return self


def init_model(
    texts: Iterable[str], out_dir: str | Path, config: TinyModelConfig | None = None
) -> Path:
    """Train a tokenizer on `texts`, build a fresh model from `config`, save both to `out_dir`.

    Returns:
        `out_dir`, loadable by `AutoModelForCausalLM.from_pretrained` and
        `AutoTokenizer.from_pretrained` with no hub access.
    """
    config = config or TinyModelConfig()
    out = Path(out_dir)
    tokenizer = train_tokenizer(
        texts, vocab_size=config.vocab_size, chat_template=config.chat_template
    )
    tokenizer.model_max_length = config.max_position_embeddings
    stops = CHAT_FORMATS[config.chat_template].stop_tokens
    eos = tokenizer.convert_tokens_to_ids(list(stops)) if stops else tokenizer.eos_token_id

    model_config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    # A private generator state would not reach the modules' own initializers,
    # so seed the global one and restore it afterwards.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = Qwen2ForCausalLM(model_config)
    model.generation_config.eos_token_id = eos  # the family's stop tokens, as its checkpoints
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id

    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def env_corpus(
    env: Environment,
    task_ids: Sequence[TaskId],
    episodes_per_task: int = 1,
    max_turns: int = 8,
    seed: int = 0,
) -> list[str]:
    """Text an environment produces, for training its tokenizer.

    Plays `episodes_per_task` random episodes of each task and collects the
    instruction, every observation and every valid action offered. Where the
    action set is not enumerable (`valid_actions()` is None), actions are one
    to three random words seen so far, which is enough to draw the env's
    answers to malformed or unknown actions into the corpus. Every value is
    checked by `rollout.contract`: a wrong type raises its
    `EnvironmentContractError`, naming the env, the method and the fix.
    """
    from agentgym_core.rollout import contract

    rng = random.Random(seed)
    texts: list[str] = []
    instructions: set[str] = set()
    words: dict[str, None] = {}  # insertion-ordered, so choices are reproducible

    def add(text: str) -> None:
        texts.append(text)
        words.update(dict.fromkeys(_WORD.findall(text)))

    for task_id in task_ids:
        for _ in range(episodes_per_task):
            add(contract.text(env, "reset", env.reset(task_id), task=task_id))
            instruction = contract.text(
                env, "instruction", env.instruction(), optional=True, task=task_id
            )
            if instruction is not None and instruction not in instructions:
                instructions.add(instruction)
                add(instruction)
            for _ in range(max_turns):
                actions = contract.actions(env, env.valid_actions(), task=task_id)
                if actions:
                    for action in actions:
                        add(action)
                    action = rng.choice(actions)
                else:
                    vocabulary = list(words) or ["look"]
                    action = " ".join(rng.choices(vocabulary, k=rng.randint(1, 3)))
                result = contract.step(env, env.step(action), task=task_id)
                add(result.observation)
                if result.done or result.truncated:
                    break
    return texts
