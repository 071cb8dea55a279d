"""Token-in-token-out conversation building for any tokenizer with a chat template.

The chat template is applied once, to the opening messages. Each later
observation is appended as the template's own delta for a new user turn, so
the sampled assistant tokens are never decoded and re-tokenized.

That is only the template's own conversation if the template is prefix-stable:
rendering one more turn must extend, not rewrite, what it rendered before, and
an assistant turn must render as the generation prompt followed by what the
model sampled. `ChatFormat` probes the template for both when it is built
(renderings of placeholder messages, no model name involved). A template that
fails and behaves as one of the two families agentgym ships a prefix-stable
variant for (Qwen3, which drops the reasoning of turns before the last user
turn; DeepSeek-R1-Distill, whose generation prompt opens a reasoning block that
it cuts from every rendered turn; `chat_templates.rewrite_style`) is swapped for
that variant with a printed notice, provided the variant renders the opening
prompt and the turn boundaries as the template does; any other fails with a
`ChatTemplateError` that names the remedy (docs/models.md).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

ACTION_CACHE_SIZE = 50_000
"""Tokenized actions a ChatFormat keeps: fixed action sets fit; open ones (spans) are dropped."""
PROMPT_CACHE_SIZE = 4096
"""Opening prompts a ChatFormat keeps (a few batches' distinct tasks); dropped when full."""
PRIMING_REPLY = "Ok."
"""AgentGym opens each conversation with the instruction and this assistant reply."""

REASONING_END = "</think>"
"""Reasoning models (Qwen3, DeepSeek-R1) close their reasoning with this; the action follows it."""

_USER_PROBE = "\x00USER\x00"
_ASSISTANT_PROBE = "\x00ASSISTANT\x00"
_REASONING_PROBE = "\x00REASONING\x00"
_OBS_PROBE = "\x00OBSERVATION\x00"
_KWARGS_ATTRIBUTE = "_agentgym_chat_template_kwargs"
_CLOCK_ATTRIBUTE = "_agentgym_chat_template_clock"
_NOTICED: set[str] = set()

REMEDY = (
    "give the tokenizer a chat template whose rendering of a longer conversation extends "
    "its rendering of a shorter one (edit chat_template in a copy of the tokenizer folder and "
    "point model.tokenizer_path at it); docs/models.md, 'Templates that rewrite history'"
)


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot be used incrementally."""


def set_chat_template_kwargs(tokenizer: Any, kwargs: Mapping[str, Any] | None) -> None:
    """Variables every `ChatFormat` of `tokenizer` passes to its chat template.

    For instance `{"enable_thinking": False}` for Qwen3's non-thinking mode
    (`model.chat_template_kwargs`). Kept on the tokenizer so that the policy's
    and the engine's `ChatFormat` render alike.
    """
    setattr(tokenizer, _KWARGS_ATTRIBUTE, dict(kwargs or {}))


def frozen_clock(tokenizer: Any) -> Callable[[str], str]:
    """The template's `strftime_now`, fixed when the first `ChatFormat` of `tokenizer` is made.

    Templates such as Llama 3.2's write today's date into every prompt. A clock that
    moved would re-render the opening turns after midnight, so a run that crosses it
    would fail mid-episode (the history no longer prefixes the next turn) and its
    cached prompts would disagree with new ones. Every `ChatFormat` of one tokenizer
    shares the clock; `date_string` in `model.chat_template_kwargs` fixes the date.
    """
    clock = getattr(tokenizer, _CLOCK_ATTRIBUTE, None)
    if clock is None:
        clock = datetime.now().strftime
        setattr(tokenizer, _CLOCK_ATTRIBUTE, clock)
    return clock


def end_of_turn_ids(tokenizer: Any, generation_config: Any = None) -> list[int]:
    """Token ids that end an assistant turn (eos of the tokenizer and of the generation config)."""
    ids: list[int] = []
    for source in (getattr(generation_config, "eos_token_id", None), tokenizer.eos_token_id):
        if source is None:
            continue
        for token_id in source if isinstance(source, list | tuple) else [source]:
            if token_id not in ids:
                ids.append(int(token_id))
    if not ids:
        raise ChatTemplateError("the tokenizer has no eos token to end an assistant turn")
    return ids


def _user(content: str) -> dict[str, str]:
    return {"role": "user", "content": content}


def _assistant(content: str) -> dict[str, str]:
    return {"role": "assistant", "content": content}


class ChatFormat:
    """Builds prompt ids and per-observation deltas from a tokenizer's chat template."""

    def __init__(self, tokenizer: Any, generation_config: Any = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                f"tokenizer {type(tokenizer).__name__} has no chat_template; "
                "set one or use a model that ships it"
            )
        self.tokenizer = tokenizer
        self._action_tokens: dict[str, tuple[int, ...]] = {}
        self._prompts: dict[tuple[str, str], tuple[int, ...]] = {}
        self.template_kwargs: dict[str, Any] = dict(getattr(tokenizer, _KWARGS_ATTRIBUTE, {}))
        """Variables passed to the template (`set_chat_template_kwargs`)."""
        self._clock = frozen_clock(tokenizer)
        self.template: str | None = None
        """The template rendered with: None, the tokenizer's own; else its prefix-stable variant."""
        problem = self._history_problem()
        if problem is not None:
            self._use_training_variant(problem)
        self._history = [_user(_USER_PROBE), _assistant(_ASSISTANT_PROBE)]
        self._history_text = self._render(self._history, add_generation_prompt=False)
        opening = self._render(self._history[:1], add_generation_prompt=True)
        content_at = self._history_text.index(_ASSISTANT_PROBE, len(opening))
        self.answer_prefix = self._history_text[len(opening) : content_at]
        """What the template writes between the generation prompt and the assistant's text
        (Mistral: a space; Qwen3 thinking: an empty reasoning block); usually nothing."""
        turn_end = self._history_text[content_at + len(_ASSISTANT_PROBE) :]
        stop_ids = end_of_turn_ids(tokenizer, generation_config)
        end_id, end_text = self._end_of_turn(turn_end, stop_ids)
        self.stop_ids = [end_id, *(i for i in stop_ids if i != end_id)]
        """Ids that end a sampled turn; the first is the one the template ends turns with."""
        self._after_stop = turn_end[len(end_text) :]
        self._opening = opening
        self._opening_ids = self._encode(opening)
        self._through_stop = self._history_text[: len(self._history_text) - len(self._after_stop)]
        """The probe history rendered up to its turn's stop token, which a delta continues."""
        self._through_stop_ids = self._encode(self._through_stop)

    def _render(
        self, messages: list[dict[str, str]], add_generation_prompt: bool, tokenize: bool = False
    ) -> Any:
        return self.tokenizer.apply_chat_template(
            messages,
            chat_template=self.template,
            tokenize=tokenize,
            add_generation_prompt=add_generation_prompt,
            **({"return_dict": False} if tokenize else {}),
            **{"strftime_now": self._clock, **self.template_kwargs},
        )

    def _history_problem(self) -> str | None:
        """How the template rewrites history, found by rendering placeholder turns; None if not."""
        opening = self._render([_user(_USER_PROBE)], add_generation_prompt=True)
        plain = [_user(_USER_PROBE), _assistant(_ASSISTANT_PROBE)]
        reasoning = f"<think>\n{_REASONING_PROBE}\n{REASONING_END}\n\n{_ASSISTANT_PROBE}"
        reasoned = [_user(_USER_PROBE), _assistant(reasoning)]
        plain_text = self._render(plain, add_generation_prompt=False)
        reasoned_text = self._render(reasoned, add_generation_prompt=False)
        for history, before in ((plain, plain_text), (reasoned, reasoned_text)):
            after = self._render([*history, _user(_OBS_PROBE)], add_generation_prompt=True)
            if not after.startswith(before):
                return "re-renders earlier turns when a user turn is added"
        if not plain_text.startswith(opening):
            dropped = opening[len(os.path.commonprefix([opening, plain_text])) :]
            return (
                "renders an assistant turn without the generation prompt it was sampled after "
                f"({dropped!r} is dropped)"
            )
        if _REASONING_PROBE not in reasoned_text:
            return f"drops an assistant turn's reasoning (the text before {REASONING_END})"
        return None

    def _landmarks(self) -> dict[str, str]:
        """What a prefix-stable variant must render exactly as the template it stands in for."""
        history = [_user(_USER_PROBE), _assistant(_ASSISTANT_PROBE), _user(_OBS_PROBE)]
        opening = self._render(history[:1], add_generation_prompt=True)
        boundary = self._render(history, add_generation_prompt=True).rpartition(_ASSISTANT_PROBE)
        return {
            "the opening prompt": opening,
            "the end of an assistant turn and the next user turn": boundary[2],
        }

    def _use_training_variant(self, problem: str) -> None:
        """Render with agentgym's prefix-stable variant of the template, or fail naming the fix."""
        from agentgym_core.modeling.chat_templates import (
            TRAINING_VARIANTS,
            read_template,
            rewrite_style,
        )

        style = rewrite_style(lambda messages, prompt: self._render(messages, prompt))
        if style is None:
            raise ChatTemplateError(f"the chat template {problem}; {REMEDY}")
        own = self._landmarks()
        name = TRAINING_VARIANTS[style]
        self.template = read_template(name)
        still = self._history_problem()
        if still is not None:
            raise ChatTemplateError(f"agentgym's template {name} {still}")
        differing = [what for what, text in self._landmarks().items() if own[what] != text]
        if differing:
            raise ChatTemplateError(
                f"the chat template {problem}, as the {style} template does, but agentgym's "
                f"variant {name} renders {' and '.join(differing)} differently, so it cannot "
                f"stand in for it; {REMEDY}"
            )
        if name not in _NOTICED:
            _NOTICED.add(name)
            print(
                f"agentgym: note: the tokenizer's chat template {problem}; rollouts render with "
                f"agentgym's prefix-stable variant {name}, which keeps every turn as sampled "
                "(docs/models.md)",
                file=sys.stderr,
            )

    def _end_of_turn(self, turn_end: str, stop_ids: list[int]) -> tuple[int, str]:
        """The stop token the template ends an assistant turn with, and its text."""
        ends = [(i, self.tokenizer.decode([i])) for i in stop_ids]
        matches = [(i, text) for i, text in ends if text and turn_end.startswith(text)]
        if not matches:
            raise ChatTemplateError(
                f"the chat template ends an assistant turn with {turn_end!r}, which starts with "
                f"none of the stop tokens {[text for _, text in ends]}; set the tokenizer's "
                "eos_token (or generation_config.eos_token_id) to the end-of-turn token"
            )
        return max(matches, key=lambda match: len(match[1]))

    def template_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """The chat template over `messages` with the generation prompt, as rollouts render it."""
        ids = self._render(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def prompt_ids(self, instruction: str, observation: str) -> list[int]:
        """Opening prompt: instruction, the priming reply, then the first observation.

        Cached: a group's episodes open on the same task, and rendering the template
        and tokenizing is a large part of a one-turn episode's own cost.
        """
        key = (instruction, observation)
        ids = self._prompts.get(key)
        if ids is None:
            if len(self._prompts) >= PROMPT_CACHE_SIZE:
                self._prompts.clear()
            ids = self._prompts[key] = tuple(
                self.template_ids(
                    [_user(instruction), _assistant(PRIMING_REPLY), _user(observation)]
                )
            )
        return list(ids)

    def observation_ids(self, observation: str) -> list[int]:
        """Tokens to append after a sampled turn (ending in a stop token) for a new observation.

        The observation is rendered by the template as one more user turn (so a
        template that trims or wraps user text does so here too); the tokens are
        the rendering's text after the previous turn's stop token.
        """
        after = self._render([*self._history, _user(observation)], add_generation_prompt=True)
        if not after.startswith(self._history_text):
            raise ChatTemplateError(
                f"the chat template re-renders earlier turns for the observation {observation!r}"
            )
        text = self._after_stop + after[len(self._history_text) :]
        return self._continuing(self._through_stop, self._through_stop_ids, text)

    def action_ids(self, action: str) -> list[int]:
        """Tokens of an action as the model should sample it, ending with the stop token."""
        return list(self.action_tokens(action))

    def action_tokens(self, action: str) -> tuple[int, ...]:
        """`action_ids` as a tuple, cached across turns.

        Constrained decoding asks for the same actions at every turn; an open action
        list (spans of text) never repeats, so the cache is dropped when it is full.
        """
        tokens = self._action_tokens.get(action)
        if tokens is None:
            if len(self._action_tokens) >= ACTION_CACHE_SIZE:
                self._action_tokens.clear()
            ids = self._continuing(self._opening, self._opening_ids, self.answer_prefix + action)
            tokens = self._action_tokens[action] = (*ids, self.stop_ids[0])
        return tokens

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _continuing(self, prefix: str, prefix_ids: list[int], text: str) -> list[int]:
        """`text` tokenized as the template's rendering has it, right after `prefix`.

        Tokenized alone, a SentencePiece-style tokenizer starts text with a word-start
        marker that the rendering has not: an action after Phi-3's `<|assistant|>` and
        newline is `turn`, not `▁turn`; a delta after Llama 2's `</s>` (TinyLlama's chat
        format writes a newline there) is `<0x0A>`, not `▁ <0x0A>`. Text that would merge
        into the prefix's own last tokens cannot continue them, and is tokenized alone.
        """
        ids = self._encode(prefix + text)
        if ids[: len(prefix_ids)] == prefix_ids:
            return ids[len(prefix_ids) :]
        return self._encode(text)

    def decode_action(self, token_ids: Sequence[int]) -> str:
        """Action text of sampled tokens: without the stop token, and after any reasoning."""
        ids = [t for t in token_ids if t not in self.stop_ids]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return text.rpartition(REASONING_END)[2].strip()
