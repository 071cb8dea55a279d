"""A byte-level BPE tokenizer trained on an environment's own text.

Nothing here reaches a model hub: the tokenizer is learned from whatever text
the caller supplies (usually `env_corpus`), so frequent environment words
("red", "ball", "turn") are single tokens and a from-scratch model spends its
capacity on the task, not on spelling. Byte-level BPE means every string
round-trips with no unknown token (NFC-normalized, as Qwen2's tokenizer does).
The chat template is a plain Jinja string, so the saved folder works with
`AutoTokenizer` and `apply_chat_template` alone. Besides agentgym's own two
styles (`chatml`, `llama3`), `CHAT_FORMATS` holds the chat formats of the model
families people train (agentgym's templates of them, `chat_templates.py`), each
with that family's special tokens, so a test or a from-scratch model can use a
family's format offline.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

from agentgym_core.modeling.chat_templates import read_template


@dataclass(frozen=True)
class ChatFormat:
    """The special tokens and Jinja template of one chat style."""

    template: str
    special_tokens: tuple[str, ...]
    eos_token: str
    """The tokenizer's eos; most families also end an assistant turn with it (Gemma: `<eos>`,
    while turns end with `<end_of_turn>`, one of its `stop_tokens`)."""
    pad_token: str
    bos_token: str | None = None
    added_tokens: tuple[str, ...] = ()
    """Tokens the template writes that the model reads as text (`<think>`): single tokens,
    kept by `decode(skip_special_tokens=True)`, as in the family's own tokenizer."""
    stop_tokens: tuple[str, ...] = ()
    """The family's `generation_config.eos_token_id`, in its order; empty: `eos_token` alone."""


# Qwen2.5 style, without Qwen's default system prompt.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Llama 3 style. Content is not trimmed (Llama's template trims) so that
# re-rendering a sampled turn gives back exactly the sampled tokens.
LLAMA3_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

_QWEN_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_LLAMA31_TOKENS = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|finetune_right_pad_id|>",
)
_GEMMA_TOKENS = ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>")


def _llama31(name: str) -> ChatFormat:
    return ChatFormat(
        template=read_template(name),
        special_tokens=_LLAMA31_TOKENS,
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
        bos_token="<|begin_of_text|>",
        stop_tokens=("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"),
    )


def _gemma(name: str) -> ChatFormat:
    return ChatFormat(
        template=read_template(name),
        special_tokens=_GEMMA_TOKENS,
        eos_token="<eos>",
        pad_token="<pad>",
        bos_token="<bos>",
        stop_tokens=("<eos>", "<end_of_turn>"),
    )


# The special tokens, eos, pad and bos of each family's checkpoints (their
# tokenizer_config.json and generation_config.json), trimmed to the tokens the
# template writes for plain text turns. Where a checkpoint pads with its eos
# (DeepSeek-R1-Distill) or has no pad (Mistral), a separate pad token stands in.
_FAMILY_FORMATS: dict[str, ChatFormat] = {
    "qwen2_5": ChatFormat(
        template=read_template("qwen2_5"),
        special_tokens=_QWEN_TOKENS,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        stop_tokens=("<|im_end|>", "<|endoftext|>"),
    ),
    "qwen3": ChatFormat(
        template=read_template("qwen3"),
        special_tokens=_QWEN_TOKENS,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        added_tokens=("<think>", "</think>"),
        stop_tokens=("<|im_end|>", "<|endoftext|>"),
    ),
    "llama3_1": _llama31("llama3_1"),
    "llama3_2": _llama31("llama3_2"),
    "mistral": ChatFormat(
        template=read_template("mistral"),
        special_tokens=("<unk>", "<s>", "</s>", "[INST]", "[/INST]"),
        eos_token="</s>",
        pad_token="<unk>",
        bos_token="<s>",
    ),
    "gemma2": _gemma("gemma2"),
    "gemma3": _gemma("gemma3"),
    "phi4": ChatFormat(
        template=read_template("phi4"),
        special_tokens=(
            "<|endoftext|>",
            "<|im_start|>",
            "<|im_sep|>",
            "<|im_end|>",
            "<|dummy_87|>",
        ),
        eos_token="<|im_end|>",
        pad_token="<|dummy_87|>",
        bos_token="<|endoftext|>",
    ),
    "deepseek_r1_distill": ChatFormat(
        template=read_template("deepseek_r1_distill"),
        special_tokens=(
            "<｜begin▁of▁sentence｜>",
            "<｜end▁of▁sentence｜>",
            "<｜User｜>",
            "<｜Assistant｜>",
            "<｜▁pad▁｜>",
        ),
        eos_token="<｜end▁of▁sentence｜>",
        pad_token="<｜▁pad▁｜>",
        bos_token="<｜begin▁of▁sentence｜>",
        added_tokens=("<think>", "</think>"),
    ),
}

ChatTemplateName = Literal[
    "chatml",
    "llama3",
    "qwen2_5",
    "qwen3",
    "llama3_1",
    "llama3_2",
    "mistral",
    "gemma2",
    "gemma3",
    "phi4",
    "deepseek_r1_distill",
]
"""The keys of `CHAT_FORMATS` (a test keeps the two in step)."""

CHAT_FORMATS: dict[str, ChatFormat] = {
    "chatml": ChatFormat(
        template=CHATML_TEMPLATE,
        special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
    ),
    "llama3": ChatFormat(
        template=LLAMA3_TEMPLATE,
        special_tokens=(
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|finetune_right_pad_id|>",
        ),
        eos_token="<|eot_id|>",
        pad_token="<|finetune_right_pad_id|>",
        bos_token="<|begin_of_text|>",
    ),
    **_FAMILY_FORMATS,
}
"""Chat styles by name: agentgym's `chatml` (Qwen) and `llama3`, then the families' own."""


ROLES = "system\nuser\nassistant"
"""Role names of the template headers, which occur once per chat turn."""


def _with_roles(texts: Iterable[str]) -> Iterable[str]:
    # Every corpus text becomes a chat turn with a role header, so the role
    # names are as frequent as the texts and become single tokens too.
    for text in texts:
        yield text
        yield ROLES


def train_tokenizer(
    texts: Iterable[str],
    *,
    vocab_size: int = 1024,
    chat_template: ChatTemplateName = "chatml",
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts` with the special tokens of a chat style.

    Args:
        texts: training text; frequent words end up as single tokens.
        vocab_size: upper bound on the vocabulary, special tokens and the 256
            byte symbols included (a small corpus may yield fewer merges).
        chat_template: a key of `CHAT_FORMATS`: agentgym's `"chatml"` or
            `"llama3"`, or a family's own template (`"qwen3"`, `"gemma3"`, ...).

    Returns:
        A transformers fast tokenizer with `chat_template`, `eos_token` (end of
        turn) and `pad_token` set; `save_pretrained` makes it loadable by
        `AutoTokenizer.from_pretrained`.
    """
    try:
        fmt = CHAT_FORMATS[chat_template]
    except KeyError:
        raise ValueError(
            f"unknown chat_template {chat_template!r}; choose one of {sorted(CHAT_FORMATS)}"
        ) from None
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    minimum = len(alphabet) + len(fmt.special_tokens)
    if vocab_size < minimum:
        raise ValueError(f"vocab_size must be at least {minimum} (bytes + special tokens)")

    # Qwen2's exact pipeline: transformers rebuilds any tokenizer saved next to
    # a qwen2 `config.json` as `Qwen2Tokenizer` from vocab and merges alone, so
    # any other normalizer or split would silently change after a reload.
    core = Tokenizer(models.BPE())
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(fmt.special_tokens),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    core.train_from_iterator(_with_roles(texts), trainer=trainer)
    if fmt.added_tokens:
        core.add_tokens([AddedToken(t, special=False, normalized=False) for t in fmt.added_tokens])

    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=fmt.bos_token,
        eos_token=fmt.eos_token,
        pad_token=fmt.pad_token,
        unk_token=None,  # saved as null, else Qwen2Tokenizer adds its default unk token
        chat_template=fmt.template,
        clean_up_tokenization_spaces=False,
    )
