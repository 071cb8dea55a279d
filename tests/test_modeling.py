"""Tokenizer training, tiny model init and corpus collection (agentgym_core.modeling)."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentgym_core.interfaces import Environment
from agentgym_core.modeling import (
    CHAT_FORMATS,
    TinyModelConfig,
    env_corpus,
    init_model,
    train_tokenizer,
)
from agentgym_core.types import StepResult

ENV_WORDS = ["red", "blue", "green", "ball", "box", "key", "door", "turn", "left", "right", "pick"]


class GridFake:
    """A hand-written environment: reach the goal word by naming actions."""

    ACTIONS = ["turn left", "turn right", "go forward", "pick up the red ball", "toggle"]

    def __init__(self, enumerable: bool = True) -> None:
        self.enumerable = enumerable
        self.task = 0
        self.turns = 0

    def tasks(self, split: str) -> list[int]:
        return list(range(5)) if split == "train" else list(range(5, 8))

    def instruction(self) -> str:
        return "You are in a grid. Answer with one action per turn."

    def reset(self, task_id: int) -> str:
        self.task, self.turns = task_id, 0
        colour = ["red", "blue", "green"][task_id % 3]
        return f"Goal: pick up the {colour} ball. You see a {colour} box to your left."

    def step(self, action: str) -> StepResult:
        self.turns += 1
        if action not in self.ACTIONS:
            return StepResult(f"Unknown action: {action}.", 0.0, False)
        done = action.startswith("pick") or self.turns >= 4
        return StepResult(f"You {action}. A key lies near the door.", float(done), done)

    def valid_actions(self) -> list[str] | None:
        return list(self.ACTIONS) if self.enumerable else None

    def task_group(self, task_id: int) -> str:
        return "easy"

    def close(self) -> None:
        pass


def corpus() -> list[str]:
    sentences = [
        "You see a red ball, a blue box and a green key.",
        "turn left",
        "turn right",
        "pick up the blue key",
        "You turn left, then pick up the red box.",
        "The door to your right is locked; open it with the green key.",
        "Goal: put the red ball next to the blue box.",
    ]
    return sentences * 200


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(corpus(), vocab_size=512)


def test_fake_env_satisfies_protocol() -> None:
    assert isinstance(GridFake(), Environment)


@pytest.mark.parametrize(
    "text",
    [
        "pick up the red ball",
        "Unseen wörds, émojis 🤖 and tabs\tand\n\nnewlines  with  double spaces ",
        "<|im_start|>literal specials<|im_end|>",
        "",
    ],
)
def test_round_trip(tokenizer, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text  # NFC text; the normalizer is Qwen2's NFC
    assert tokenizer.unk_token_id is None or tokenizer.unk_token_id not in ids


def test_env_words_are_single_tokens(tokenizer) -> None:
    for word in ENV_WORDS:
        assert len(tokenizer.encode(" " + word, add_special_tokens=False)) == 1, word
    for action in ("turn left", "pick up the blue key"):
        assert len(tokenizer.encode(action, add_special_tokens=False)) == len(action.split())


def test_vocab_size_bounds(tokenizer) -> None:
    assert len(tokenizer) <= 512
    with pytest.raises(ValueError, match="at least"):
        train_tokenizer(corpus(), vocab_size=100)
    with pytest.raises(ValueError, match="chat_template"):
        train_tokenizer(corpus(), chat_template="alpaca")


MESSAGES = [
    {"role": "system", "content": "rules"},
    {"role": "user", "content": "You see a red ball."},
    {"role": "assistant", "content": "pick up the red ball"},
    {"role": "user", "content": "Done."},
]


@pytest.mark.parametrize(
    ("template", "eos", "generation_prompt"),
    [
        ("chatml", "<|im_end|>", "<|im_start|>assistant\n"),
        ("llama3", "<|eot_id|>", "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    ],
)
def test_templates_reload_and_render(tmp_path, template, eos, generation_prompt) -> None:
    trained = train_tokenizer(corpus(), vocab_size=512, chat_template=template)
    trained.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)

    assert loaded.eos_token == eos
    assert loaded.pad_token is not None and loaded.pad_token != eos
    text = loaded.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert text.endswith(generation_prompt)
    assert f"pick up the red ball{eos}" in text
    assert text == trained.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    ids = loaded.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)
    assert loaded.decode(ids) == text
    assert ids.count(loaded.eos_token_id) == len(MESSAGES)


def test_templates_differ() -> None:
    rendered = {
        name: train_tokenizer(corpus(), vocab_size=512, chat_template=name).apply_chat_template(
            MESSAGES, add_generation_prompt=True, tokenize=False
        )
        for name in ("chatml", "llama3")
    }
    assert rendered["chatml"] != rendered["llama3"]
    assert rendered["llama3"].startswith("<|begin_of_text|>")
    assert "<|im_start|>" in rendered["chatml"] and "<|start_header_id|>" not in rendered["chatml"]


SMALL = TinyModelConfig(hidden_size=32, num_heads=4, num_kv_heads=2, intermediate_size=64)


@pytest.mark.parametrize("template", ["chatml", "llama3"])
def test_model_reloads_with_logits(tmp_path, template) -> None:
    config = SMALL.model_copy(update={"chat_template": template})
    path = init_model(corpus(), tmp_path / "model", config)
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)

    assert model.config.vocab_size == len(tokenizer)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    assert tokenizer.model_max_length == config.max_position_embeddings
    batch = tokenizer.apply_chat_template(
        MESSAGES[:2], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (1, batch["input_ids"].shape[1], len(tokenizer))


def test_model_folder_tokenizes_like_the_trained_tokenizer(tmp_path) -> None:
    # transformers rebuilds a tokenizer next to a qwen2 config as Qwen2Tokenizer.
    for template in ("chatml", "llama3"):
        config = SMALL.model_copy(update={"chat_template": template})
        trained = train_tokenizer(corpus(), vocab_size=config.vocab_size, chat_template=template)
        loaded = AutoTokenizer.from_pretrained(init_model(corpus(), tmp_path / template, config))
        assert len(loaded) == len(trained)
        assert loaded.get_vocab() == trained.get_vocab()
        for text in [*corpus()[:7], "Ünïcode 🤖\n\n  spaces\t", "it's 42 <|eot_id|><|im_end|>"]:
            assert loaded.encode(text) == trained.encode(text), text


def test_same_seed_same_weights(tmp_path) -> None:
    first = init_model(corpus(), tmp_path / "a", SMALL)
    second = init_model(corpus(), tmp_path / "b", SMALL)
    other = init_model(corpus(), tmp_path / "c", SMALL.model_copy(update={"seed": 1}))
    a, b, c = (load_file(p / "model.safetensors") for p in (first, second, other))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert (first / "tokenizer.json").read_text() == (second / "tokenizer.json").read_text()


def test_config_validation() -> None:
    with pytest.raises(ValidationError, match="divisible"):
        TinyModelConfig(hidden_size=30, num_heads=4)
    with pytest.raises(ValidationError, match="divisible"):
        TinyModelConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValidationError):
        TinyModelConfig(hidden_sizes=64)
    for name, field in TinyModelConfig.model_fields.items():
        assert field.description, name


def test_env_corpus_collects_instruction_observations_and_actions() -> None:
    env = GridFake()
    texts = env_corpus(env, env.tasks("train"), episodes_per_task=2, max_turns=3, seed=0)
    assert texts.count(env.instruction()) == 1
    assert "Goal: pick up the blue ball. You see a blue box to your left." in texts
    assert set(GridFake.ACTIONS) <= set(texts)
    assert any(t.startswith("You ") and "key lies" in t for t in texts)
    assert texts == env_corpus(GridFake(), env.tasks("train"), episodes_per_task=2, max_turns=3)


def test_env_corpus_without_enumerable_actions() -> None:
    texts = env_corpus(GridFake(enumerable=False), [0, 1], max_turns=4, seed=3)
    assert any(t.startswith("Unknown action: ") for t in texts)
    assert not set(GridFake.ACTIONS) & set(texts)
    tokenizer = train_tokenizer(texts * 50, vocab_size=400)
    assert len(tokenizer.encode(" ball", add_special_tokens=False)) == 1


FAMILIES = [name for name in CHAT_FORMATS if name not in ("chatml", "llama3")]


@pytest.mark.parametrize("template", FAMILIES)
def test_family_templates_reload_with_their_tokens(tmp_path, template) -> None:
    config = SMALL.model_copy(update={"chat_template": template})
    fmt = CHAT_FORMATS[template]
    trained = train_tokenizer(corpus(), vocab_size=config.vocab_size, chat_template=template)
    path = init_model(corpus(), tmp_path / template, config)
    loaded = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)

    assert loaded.chat_template == fmt.template
    assert loaded.get_vocab() == trained.get_vocab()
    assert (loaded.eos_token, loaded.pad_token, loaded.bos_token) == (
        fmt.eos_token,
        fmt.pad_token,
        fmt.bos_token,
    )
    conversation = MESSAGES[1:]  # Gemma 2 refuses a system message
    text = loaded.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    ids = loaded.encode(text, add_special_tokens=False)
    assert ids == trained.encode(text, add_special_tokens=False)
    for token in (*fmt.special_tokens, *fmt.added_tokens):
        assert len(loaded.encode(token, add_special_tokens=False)) == 1, token
    for token in fmt.added_tokens:  # model text, like Qwen3's <think>: kept when decoding
        assert loaded.decode(loaded.encode(token), skip_special_tokens=True) == token
    stops = loaded.convert_tokens_to_ids(list(fmt.stop_tokens)) if fmt.stop_tokens else None
    assert model.generation_config.eos_token_id == (stops or loaded.eos_token_id)
