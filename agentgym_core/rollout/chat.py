"""Token-in-token-out conversation building for any tokenizer with a chat template.

The chat template is applied once, to the opening messages. Each later
observation is appended as the template's own delta for a new user turn, so
the sampled assistant tokens are never decoded and re-tokenized.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PRIMING_REPLY = "Ok."
"""AgentGym opens each conversation with the instruction and this assistant reply."""

_USER_PROBE = "\x00USER\x00"
_ASSISTANT_PROBE = "\x00ASSISTANT\x00"
_OBS_PROBE = "\x00OBSERVATION\x00"


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot be used incrementally."""


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


class ChatFormat:
    """Builds prompt ids and per-observation deltas from a tokenizer's chat template."""

    def __init__(self, tokenizer: Any, generation_config: Any = None) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError(
                f"tokenizer {type(tokenizer).__name__} has no chat_template; "
                "set one or use a model that ships it"
            )
        self.tokenizer = tokenizer
        self.stop_ids = end_of_turn_ids(tokenizer, generation_config)
        self._prefix, self._suffix = self._observation_frame()

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _observation_frame(self) -> tuple[str, str]:
        """Text around an observation between an ended assistant turn and the next one."""
        history = [
            {"role": "user", "content": _USER_PROBE},
            {"role": "assistant", "content": _ASSISTANT_PROBE},
        ]
        before = self._render(history, add_generation_prompt=False)
        after = self._render(
            [*history, {"role": "user", "content": _OBS_PROBE}], add_generation_prompt=True
        )
        if not after.startswith(before):
            raise ChatTemplateError(
                "the chat template rewrites earlier turns when a user turn is added; "
                "token-in-token-out rollouts need a template whose prefixes are stable"
            )
        tail = before[before.index(_ASSISTANT_PROBE) + len(_ASSISTANT_PROBE) :]
        for stop_id in self.stop_ids:
            stop_text = self.tokenizer.decode([stop_id])
            if stop_text and tail.startswith(stop_text):
                tail = tail[len(stop_text) :]
                break
        delta = tail + after[len(before) :]
        prefix, _, suffix = delta.partition(_OBS_PROBE)
        return prefix, suffix

    def prompt_ids(self, instruction: str, observation: str) -> list[int]:
        """Opening prompt: instruction, the priming reply, then the first observation."""
        messages = [
            {"role": "user", "content": instruction},
            {"role": "assistant", "content": PRIMING_REPLY},
            {"role": "user", "content": observation},
        ]
        ids = self.tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=True, return_dict=False
        )
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def observation_ids(self, observation: str) -> list[int]:
        """Tokens to append after a sampled turn (ending in a stop token) for a new observation."""
        text = self._prefix + observation + self._suffix
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def action_ids(self, action: str) -> list[int]:
        """Tokens of an action as the model should sample it, ending with the stop token."""
        return [*self.tokenizer.encode(action, add_special_tokens=False), self.stop_ids[0]]

    def decode_action(self, token_ids: Sequence[int]) -> str:
        """Action text of sampled tokens, without the stop token."""
        ids = [t for t in token_ids if t not in self.stop_ids]
        return self.tokenizer.decode(ids, skip_special_tokens=True).strip()
