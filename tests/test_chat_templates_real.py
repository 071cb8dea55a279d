"""Real tokenizers' chat formats, token in and token out (docs/models.md).

The multi-turn checks of `test_chat_templates.py` on five real tokenizers,
llama.cpp's vocab files (`agentgym model fetch tokenizer-*`): Qwen2 and Phi-3
with the chat template their folder carries, Llama 3 BPE (no template) with
agentgym's `llama3_1`, DeepSeek LLM (no template) with DeepSeek LLM Chat's own
format, Llama 2's SentencePiece (no template) with TinyLlama-Chat's. A
from-scratch model with the tokenizer's whole vocabulary (hidden size 32, one
layer) plays BabyAI through the real `hf` policy.

Observations here carry edges that the tokenizer merges with the template text
around them, which tokenizing an observation apart would get wrong.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from chat_episodes import OBSERVATIONS, check_deltas, check_trajectory, play, rendered_ids
from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from agentgym_core.modeling.chat_templates import read_template
from agentgym_core.rollout.chat import PRIMING_REPLY, ChatFormat

pytest.importorskip("agentgym_env_babyai")

# DeepSeek LLM Chat's template (deepseek-ai/deepseek-llm-7b-chat, tokenizer_config.json), as
# llama.cpp recognises it. Its vocab file has no template and its only special tokens are
# <｜begin▁of▁sentence｜>, <｜end▁of▁sentence｜> and <|endoftext|>: none of agentgym's family
# templates fits (ChatML's <|im_start|>, DeepSeek-R1's <｜User｜> would be spelt out in pieces).
# Roles are plain text, and an assistant turn ends with eos.
DEEPSEEK_LLM_CHAT = (
    "{% if not add_generation_prompt is defined %}"
    "{% set add_generation_prompt = false %}{% endif %}"
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ 'User: ' + message['content'] + '\\n\\n' }}"
    "{% elif message['role'] == 'assistant' %}{{ 'Assistant: ' + message['content'] + eos_token }}"
    "{% elif message['role'] == 'system' %}{{ message['content'] + '\\n\\n' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

# TinyLlama-1.1B-Chat-v1.0's template (Zephyr's format) on its own tokenizer, Llama 2's
# SentencePiece vocabulary: roles are plain text and a newline follows each eos. That
# tokenizer writes a word-start marker only at the start of its input, so a delta tokenized
# alone would open with a `▁` the rendering has not.
TINYLLAMA_CHAT = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ '<|user|>\n' + message['content'] + eos_token }}\n"
    "{% elif message['role'] == 'system' %}{{ '<|system|>\n' + message['content'] + eos_token }}"
    "\n{% elif message['role'] == 'assistant' %}"
    "{{ '<|assistant|>\n' + message['content'] + eos_token }}\n{% endif %}"
    "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>' }}\n{% endif %}"
    "{% endfor %}"
)


@dataclasses.dataclass(frozen=True)
class Real:
    """A real tokenizer's chat format and how observations merge into it."""

    template: str | None
    """None: the template of the tokenizer's folder."""
    stops: tuple[str, ...]
    """The checkpoints' generation_config.json eos_token_id (Qwen2.5-Instruct, Llama-3-Instruct,
    Phi-3-mini-instruct, deepseek-llm-chat): a user's model brings it, and `ChatFormat` takes
    the end-of-turn token from it where that is not the tokenizer's eos."""
    end_of_turn: str
    """The one of `stops` that the template ends an assistant turn with."""
    merging: tuple[bool, ...]
    """Which of MERGING the tokenizer merges with the template text around it."""


MERGING = [
    "Your goal: go to the red ball",
    "\nYou see: a wall.\n",
    " \nYou carry: nothing. ",
    "  Ahead: a wall 1 step forward.",
    '\n\nAvailable actions: ["turn left", "drop"]\n\n',
]
"""Observations whose edges a BPE joins to what the template writes before them."""

REAL = {
    # The newline after `user` joins the observation's leading newlines into one token.
    "qwen2": Real(
        None, ("<|im_end|>", "<|endoftext|>"), "<|im_end|>", (False, True, True, False, True)
    ),
    # Nothing can merge: the template trims the observation, and Llama 3's split pattern
    # never joins a newline (the header's) to the text after it.
    "llama3": Real(
        read_template("llama3_1"), ("<|end_of_text|>", "<|eot_id|>"), "<|eot_id|>", (False,) * 5
    ),
    # SentencePiece-style: apart, the text starts with a word-start marker (`▁Your`, `▁▁`) that
    # it has not after the header's newline.
    "phi3": Real(None, ("<|endoftext|>", "<|assistant|>", "<|end|>"), "<|end|>", (True,) * 5),
    # The space after `User:` joins the observation's first word or spaces (`ĠYour`, `ĠĠ`).
    "deepseek-llm": Real(
        DEEPSEEK_LLM_CHAT,
        ("<｜end▁of▁sentence｜>",),
        "<｜end▁of▁sentence｜>",
        (True, False, True, True, False),
    ),
    # Text after `<|user|>` and a newline starts without the word-start marker it gets alone.
    "llama-spm": Real(TINYLLAMA_CHAT, ("</s>",), "</s>", (True, True, False, False, True)),
}

EDGES = [("", ""), (" \n", " "), ("\n\n", "\n")]
"""Around the k-th observation of an episode; the second merges in all but Llama 3 and 2."""


class Edged:
    """BabyAI whose k-th observation of an episode is wrapped in EDGES[k]."""

    def __init__(self, env) -> None:
        self.env = env
        self.turn = 0

    def __getattr__(self, name):
        return getattr(self.env, name)

    def reset(self, task_id):
        self.turn = 0
        return self._edged(self.env.reset(task_id))

    def step(self, action):
        result = self.env.step(action)
        self.turn += 1
        return dataclasses.replace(result, observation=self._edged(result.observation))

    def _edged(self, observation: str) -> str:
        lead, trail = EDGES[self.turn % len(EDGES)]
        return lead + observation + trail


@pytest.fixture(scope="module")
def make_env():
    """A factory of real BabyAI environments (through the plugin registry), edged."""
    from agentgym_core.plugins import PluginHost

    registration = PluginHost().registry.get("environment", "babyai")
    config = registration.config(levels=["PutNextLocal"])
    return lambda: Edged(registration.factory(config))


@pytest.fixture(scope="module")
def real_tokenizer(real_tokenizer_dir):
    """Factory: a real tokenizer with its chat template, and its generation config; loaded once."""

    @functools.cache
    def load(name):
        tokenizer = AutoTokenizer.from_pretrained(real_tokenizer_dir(name))
        if REAL[name].template is not None:
            assert not tokenizer.chat_template, "the folder brings no template of its own"
            tokenizer.chat_template = REAL[name].template
        stops = tokenizer.convert_tokens_to_ids(list(REAL[name].stops))
        return tokenizer, GenerationConfig(eos_token_id=stops)

    return load


def _tiny_model(tokenizer, generation_config):
    """A from-scratch model as wide as the tokenizer's vocabulary, narrow everywhere else."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
    model.generation_config = generation_config
    return model


_PROBE = "\x00OBSERVATION\x00"


def _merges(chat: ChatFormat, observation: str) -> bool:
    """Whether tokenizing the observation apart from the template text around it changes ids."""

    def text(content):
        messages = [
            {"role": "user", "content": "Play."},
            {"role": "assistant", "content": PRIMING_REPLY},
            {"role": "user", "content": content},
        ]
        return chat.tokenizer.apply_chat_template(
            messages,
            chat_template=chat.template,
            tokenize=False,
            add_generation_prompt=True,
            **chat.template_kwargs,
        )

    before, after = text(_PROBE).split(_PROBE)
    whole = text(observation)
    inside = whole[len(before) : len(whole) - len(after)]  # as rendered: trimmed, where trimmed
    encode = functools.partial(chat.tokenizer.encode, add_special_tokens=False)
    return encode(whole) != encode(before) + encode(inside) + encode(after)


@pytest.mark.pretrained
@pytest.mark.parametrize("name", REAL)
def test_deltas_are_a_real_templates_own_turns(real_tokenizer, name):
    """Deltas and actions are the template's turns, tokenized as its rendering has them.

    Each observation here is tokenized together with the template text around it,
    where a BPE merges it with that text (`merging`), so the ids built turn by turn
    equal the one-go rendering's. An action is tokenized as it continues the
    generation prompt: Phi-3 writes no word-start marker after `<|assistant|>` and a
    newline (`turn`, where the action alone starts `▁turn`).
    """
    tokenizer, generation_config = real_tokenizer(name)
    chat = ChatFormat(tokenizer, generation_config)
    assert tokenizer.convert_ids_to_tokens(chat.stop_ids[:1]) == [REAL[name].end_of_turn]
    assert tuple(_merges(chat, observation) for observation in MERGING) == REAL[name].merging
    check_deltas(chat, [*OBSERVATIONS, *MERGING])
    opening = rendered_ids(chat, [{"role": "user", "content": "Play."}], generation_prompt=True)
    answered = rendered_ids(
        chat,
        [{"role": "user", "content": "Play."}, {"role": "assistant", "content": "turn left"}],
        generation_prompt=False,
    )
    assert answered[len(opening) :][: len(chat.action_ids("turn left"))] == chat.action_ids(
        "turn left"
    )


@pytest.mark.pretrained
@pytest.mark.parametrize("name", REAL)
def test_the_learner_trains_on_what_a_real_tokenizer_gave_and_sampled(
    real_tokenizer, make_env, name
):
    """The checks of `test_chat_templates.py`, with observations that merge at their edges.

    After the first, an episode's observations open with whitespace that the
    tokenizer joins to the text the template writes before them (Llama 3 excepted:
    its template trims them). Every prompt is still the previous one, exactly the
    ids sampled and the delta, and in constrained episodes the template's own
    rendering in one go: the delta is tokenized with the template text around the
    observation, as the one-go rendering is.
    """
    tokenizer, generation_config = real_tokenizer(name)
    model = _tiny_model(tokenizer, generation_config)
    env = make_env()
    instruction = env.instruction()
    for task, constrained in [(0, True), (1, False)]:
        chat, traj, calls = play(make_env, model, tokenizer, task, constrained=constrained)
        first = env.reset(task)
        check_trajectory(chat, traj, calls, instruction, first, constrained=constrained)
        assert traj.turns[0].observation.startswith(EDGES[1][0])
        # a space then a newline: SentencePiece writes `▁` then `<0x0A>` wherever they are
        assert _merges(chat, traj.turns[0].observation) == (name not in ("llama3", "llama-spm"))
    env.close()
