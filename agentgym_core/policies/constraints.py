"""Decoding restricted to a list of allowed actions, and the same restriction for the learner.

Each allowed action is a token sequence ending in the stop token. At every
position the sampler may only pick a token that keeps the prefix on one of
those sequences; the set of such tokens is recorded with the sample, so that
the learner renormalizes over exactly the same set when it recomputes
log-probabilities and the importance ratio stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class ActionConstraint:
    """Prefix matcher over the token sequences of the allowed actions."""

    def __init__(self, actions: Sequence[str], sequences: Sequence[Sequence[int]]) -> None:
        if not actions:
            raise ValueError("constrained decoding needs at least one allowed action")
        self.actions = list(actions)
        self.sequences = [tuple(s) for s in sequences]
        self.prefix: list[int] = []

    def allowed(self) -> tuple[int, ...]:
        """Token ids that continue the current prefix on some allowed sequence, sorted."""
        n = len(self.prefix)
        prefix = tuple(self.prefix)
        options = {s[n] for s in self.sequences if len(s) > n and s[:n] == prefix}
        return tuple(sorted(options))

    def advance(self, token_id: int) -> None:
        """Record a sampled token."""
        self.prefix.append(int(token_id))

    def forced_tail(self) -> list[int]:
        """The tokens that must follow if only one allowed sequence remains; else empty."""
        n = len(self.prefix)
        prefix = tuple(self.prefix)
        matches = [s for s in self.sequences if len(s) > n and s[:n] == prefix]
        if len(matches) != 1 or prefix in self.sequences:
            return []
        return list(matches[0][n:])

    @property
    def complete(self) -> bool:
        """True once the prefix equals one whole allowed sequence."""
        return tuple(self.prefix) in self.sequences

    def matched_action(self) -> str:
        """The action whose tokens were sampled (valid once complete)."""
        return self.actions[self.sequences.index(tuple(self.prefix))]


def allowed_mask(
    rows: Sequence[int], allowed: Sequence[Sequence[int]], shape: tuple[int, int], device=None
) -> torch.Tensor:
    """A [N, V] bool tensor, True where the id is NOT allowed on the given rows (one scatter)."""
    blocked = torch.zeros(shape, dtype=torch.bool, device=device)
    if not rows:
        return blocked
    index = torch.as_tensor(list(rows), device=device)
    blocked[index] = True
    lengths = torch.as_tensor([len(ids) for ids in allowed], device=device)
    flat_rows = torch.repeat_interleave(index, lengths)
    flat_ids = torch.as_tensor([i for ids in allowed for i in ids], dtype=torch.long, device=device)
    blocked[flat_rows, flat_ids] = False
    return blocked


def apply_allowed_mask(
    logits: torch.Tensor, rows: Sequence[int], allowed: Sequence[Sequence[int]]
) -> torch.Tensor:
    """Set logits outside the allowed ids to -inf on the given rows of a [N, V] tensor."""
    if not rows:
        return logits
    blocked = allowed_mask(rows, allowed, tuple(logits.shape), logits.device)
    return logits.masked_fill(blocked, float("-inf"))
