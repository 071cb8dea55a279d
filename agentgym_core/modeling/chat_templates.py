"""agentgym's renderings of the chat formats of the model families it is tested with.

`templates/<name>.jinja` is a short Jinja template written here to one
family's documented format (special tokens, role names, newlines, default
system prompt, whitespace trimming, where a system message goes), for the
conversations agentgym builds: system, user and assistant text turns, no
tools. They are not the model repositories' own template text; a real
checkpoint brings its own, and `rollout.chat.ChatFormat` probes whatever it
gets. `templates/<name>_training.jinja` is the prefix-stable variant of a
family whose template rewrites history.

`rewrite_style` recognises those families by behaviour, not by text, so that
a checkpoint's template (written differently from ours) is recognised too.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

TEMPLATE_DIR = Path(__file__).with_name("templates")

TRAINING_VARIANTS: dict[str, str] = {
    "qwen3": "qwen3_training",
    "deepseek_r1_distill": "deepseek_r1_distill_training",
}
"""Rewriting style (`rewrite_style`) -> the name of agentgym's prefix-stable variant for it."""

Render = Callable[[list[dict[str, str]], bool], str]
"""`render(messages, add_generation_prompt)`: a chat template's text for `messages`."""

_QUESTION = "\x00QUESTION\x00"
_REASONING = "\x00REASONING\x00"
_ANSWER = "\x00ANSWER\x00"
_FOLLOW_UP = "\x00FOLLOW-UP\x00"


@cache
def read_template(name: str) -> str:
    """The text of `templates/<name>.jinja`, exactly as stored.

    Raises:
        ValueError: no template of that name.
    """
    path = TEMPLATE_DIR / f"{name}.jinja"
    if not path.is_file():
        known = sorted(p.stem for p in TEMPLATE_DIR.glob("*.jinja"))
        raise ValueError(f"no chat template {name!r}; shipped: {', '.join(known)}")
    return path.read_text(encoding="utf-8")


def rewrite_style(render: Render) -> str | None:
    r"""Which known way of rewriting history a template shows: a `TRAINING_VARIANTS` key or None.

    Three renderings of placeholder turns: the generation prompt after a user
    turn; an assistant turn `<think>\nR\n</think>\n\nA` ending the
    conversation; the same turn followed by another user turn.

    - `"qwen3"`: R is kept while the assistant turn is the last one and gone
      once a user turn follows; the generation prompt does not open a
      reasoning block.
    - `"deepseek_r1_distill"`: the generation prompt opens a reasoning block
      (ends with `<think>` and whitespace) and R is gone even from the last turn.

    Anything else is None, including a template that is prefix-stable.
    """
    question = {"role": "user", "content": _QUESTION}
    reasoned = {
        "role": "assistant",
        "content": f"<think>\n{_REASONING}\n</think>\n\n{_ANSWER}",
    }
    follow_up = {"role": "user", "content": _FOLLOW_UP}
    opening = render([question], True)
    kept_last = _REASONING in render([question, reasoned], False)
    kept_earlier = _REASONING in render([question, reasoned, follow_up], True)
    opens_reasoning = opening.rstrip().endswith("<think>")
    if kept_last and not kept_earlier and not opens_reasoning:
        return "qwen3"
    if opens_reasoning and not kept_last and not kept_earlier:
        return "deepseek_r1_distill"
    return None
