"""How allowed action sequences travel to vLLM's logits processor (no vLLM import here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

EXTRA_ARG = "agentgym_allowed_sequences"
"""Key of `SamplingParams.extra_args` holding the allowed token sequences (lists of ints)."""


def encode_sequences(sequences: Sequence[Sequence[int]]) -> list[str]:
    """Allowed sequences as an HTTP request's `vllm_xargs` can carry them: "12 7 3" each."""
    return [" ".join(str(int(t)) for t in sequence) for sequence in sequences]


def decode_sequences(value: Sequence[Any]) -> list[list[int]]:
    """`extra_args` sequences as lists of ints, from lists (in process) or strings (HTTP)."""
    return [
        [int(t) for t in item.split()] if isinstance(item, str) else [int(t) for t in item]
        for item in value
    ]
