"""A byte-level BPE tokenizer trained on an environment's own text.

Nothing here reaches a model hub: the tokenizer is learned from whatever text
the caller supplies (usually `env_corpus`), so frequent environment words
("red", "ball", "turn") are single tokens and a from-scratch model spends its
capacity on the task, not on spelling. Byte-level BPE means every string
round-trips with no unknown token (NFC-normalized, as Qwen2's tokenizer does).
The chat template is a plain Jinja string, so the saved folder works with
`AutoTokenizer` and `apply_chat_template` alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX


@dataclass(frozen=True)
class ChatFormat:
    """The special tokens and Jinja template of one chat style."""

    template: str
    special_tokens: tuple[str, ...]
    eos_token: str
    """End of an assistant turn: generation stops here."""
    pad_token: str
    bos_token: str | None = None


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
}
"""Chat styles by name: `chatml` (Qwen) and `llama3`."""


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
    chat_template: str = "chatml",
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts` with the special tokens of a chat style.

    Args:
        texts: training text; frequent words end up as single tokens.
        vocab_size: upper bound on the vocabulary, special tokens and the 256
            byte symbols included (a small corpus may yield fewer merges).
        chat_template: `"chatml"` or `"llama3"`.

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

    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=fmt.bos_token,
        eos_token=fmt.eos_token,
        pad_token=fmt.pad_token,
        unk_token=None,  # saved as null, else Qwen2Tokenizer adds its default unk token
        chat_template=fmt.template,
        clean_up_tokenization_spaces=False,
    )
