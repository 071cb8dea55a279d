"""Reuse of each episode's keys and values from one turn to the next.

Turn k of an episode sends the whole conversation again; all of it but the
last action's final token and the new observation was already computed at
turn k-1. The policy keeps that KV state per session (one episode) and only
runs the new tokens. Rows of a batch have caches of different lengths: each
row is laid out as `[pad | cached | pad | new]`, with the pads masked out and
explicit position ids, so no token moves.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache

from agentgym_core.policies.growing_cache import GrowingLayer, growing_layers

KeysValues = tuple[torch.Tensor, torch.Tensor]
"""One layer's keys and values."""


@dataclass
class Entry:
    """The tokens a session's cache covers and its per-layer (keys, values), [heads, T, dim]."""

    token_ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class Prefill:
    """Inputs of the first forward pass of a batch."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    """Each row's cached and new tokens, then `room` zeros: it covers the cache's room."""
    position_ids: torch.Tensor
    cache: Cache
    """The rows' cached keys and values, in buffers with room for the new tokens and
    `room` more (`GrowingLayer`): the prefill and the decode write into them in place."""
    reused: list[int]
    """Cached prefix length used for each row."""
    new: list[int]
    """Uncached tail length of each row: the tokens the prefill computes."""


class PrefixCache:
    """Per-session KV store with least-recently-used eviction.

    Thread-safe: the generation thread looks up and stores entries while the
    event loop releases finished episodes' sessions.
    """

    def __init__(self, max_sessions: int = 4096, kv_dtype: torch.dtype | None = None) -> None:
        self.max_sessions = max_sessions
        self.kv_dtype = kv_dtype
        """The dtype a batch's keys and values are kept in; None: the model's
        (`growing_cache` says when they differ)."""
        self._entries: OrderedDict[Hashable, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.reused_tokens = 0
        self.computed_tokens = 0
        self.padded_tokens = 0
        """Positions the prefills ran, padding included (rows x longest uncached tail)."""

    def __len__(self) -> int:
        return len(self._entries)

    def release(self, session: Hashable) -> None:
        """Forget a session (its episode ended)."""
        with self._lock:
            self._entries.pop(session, None)

    def clear(self) -> None:
        """Forget everything (weights changed: every cached key is stale)."""
        with self._lock:
            self._entries.clear()

    def lookup(
        self, session: Hashable | None, prompt: Sequence[int], *, take: bool = False
    ) -> Entry | None:
        """The session's entry if its tokens are a strict prefix of `prompt`.

        `take` also forgets it, for a caller that will store the session's longer
        state: its keys are then freed as soon as they are copied into a batch, not
        kept beside the batch's copy until the turn ends.
        """
        if session is None:
            return None
        with self._lock:
            entry = self._entries.pop(session, None) if take else self._entries.get(session)
            if entry is None:
                return None
            n = len(entry.token_ids)
            if n >= len(prompt) or list(prompt[:n]) != entry.token_ids:
                self._entries.pop(session, None)
                return None
            if not take:
                self._entries.move_to_end(session)
            return entry

    def prefill(
        self,
        prompts: Sequence[Sequence[int]],
        entries: Sequence[Entry | None],
        pad_id: int,
        room: int = 0,
        layout: Sequence[KeysValues] | None = None,
        groups: Sequence[int] | None = None,
    ) -> Prefill:
        """Batch inputs that run only each prompt's uncached tail; `room`: tokens to decode.

        `layout`, each layer's keys and values of no token ([heads, 0, dim]), has the
        buffers made even when no row has a cache, so that groups of rows can prefill
        into them in place (`GrowingLayer.group`); without it such a batch's buffers
        are made at the prefill's first write. `groups`: the sizes of the consecutive row
        groups the caller prefills one by one, each to its own longest tail (for
        `padded_tokens`); None: one group.
        """
        reused = [len(e.token_ids) if e else 0 for e in entries]
        new = [list(p[r:]) for p, r in zip(prompts, reused, strict=True)]
        cached_width, new_width = max(reused), max(len(n) for n in new)
        rows = len(prompts)
        ids = torch.full((rows, new_width), pad_id, dtype=torch.long)
        positions = torch.zeros((rows, new_width), dtype=torch.long)
        attention = torch.zeros((rows, cached_width + new_width + room), dtype=torch.long)
        for i, (tail, start) in enumerate(zip(new, reused, strict=True)):
            ids[i, new_width - len(tail) :] = torch.tensor(tail)
            positions[i, new_width - len(tail) :] = torch.arange(start, start + len(tail))
            attention[i, cached_width - start : cached_width] = 1
            attention[i, cached_width + new_width - len(tail) : cached_width + new_width] = 1
        self.reused_tokens += sum(reused)
        self.computed_tokens += sum(len(n) for n in new)
        start = 0
        for size in groups or [rows]:
            self.padded_tokens += size * max(len(n) for n in new[start : start + size])
            start += size
        cache = self._batch_cache(entries, cached_width, new_width, room, layout)
        return Prefill(ids, attention, positions, cache, reused, [len(n) for n in new])

    def _batch_cache(
        self,
        entries: Sequence[Entry | None],
        width: int,
        tail: int,
        room: int,
        layout: Sequence[KeysValues] | None,
    ) -> Cache:
        """The entries' keys and values right-aligned in `width` columns.

        With room for the `tail` tokens prefilled next and `room` decoded after them.
        """
        template = next((e for e in entries if e is not None and e.token_ids), None)
        shapes = template.layers if template is not None else layout
        if shapes is None:
            return growing_layers(room, whole=True, dtype=self.kv_dtype)
        layers = []
        for index, (keys, values) in enumerate(shapes):
            layer = GrowingLayer.zeros(
                len(entries), keys, values, width, tail + room, whole=True, dtype=self.kv_dtype
            )
            for row, entry in enumerate(entries):
                if entry is not None:
                    k, v = entry.layers[index]
                    layer.keys[row, :, width - k.shape[1] :] = k
                    layer.values[row, :, width - v.shape[1] :] = v
            layers.append(layer)
        return Cache(layers=layers)

    def store(
        self,
        sessions: Sequence[Hashable | None],
        token_ids: Sequence[list[int]],
        cache: Cache,
        attention_mask: torch.Tensor,
    ) -> None:
        """Keep each row of a batch cache that has a session; consumes `cache`.

        A row keeps the columns its mask marks, which hold its `token_ids`. Layer by
        layer, each layer's batch buffers dropped once its rows are copied out: memory
        then peaks at one copy of the sessions' keys and values plus one layer,
        not two copies (a row's columns are not contiguous, so each is copied).
        """
        kept = [row for row, session in enumerate(sessions) if session is not None]
        width = cache.layers[0].keys.shape[-2]
        columns = {row: attention_mask[row, :width].nonzero().squeeze(1) for row in kept}
        # a layout not understood: recompute next turn rather than risk a wrong cache
        kept = [row for row in kept if len(columns[row]) == len(token_ids[row])]
        layers: dict[int, list[KeysValues]] = {row: [] for row in kept}
        for layer in cache.layers:
            for row in kept:
                keys, values = layer.keys[row], layer.values[row]
                layers[row].append(
                    (keys.index_select(1, columns[row]), values.index_select(1, columns[row]))
                )
            drop = getattr(layer, "drop", None)
            if drop is not None:
                drop()
        for row in kept:
            self._put(sessions[row], list(token_ids[row]), layers.pop(row))

    def store_row(
        self,
        session: Hashable,
        token_ids: list[int],
        layers: Sequence[tuple[torch.Tensor, torch.Tensor]],
        attention_row: torch.Tensor,
    ) -> None:
        """Keep one row's (keys, values), [heads, columns, dim]: the columns its mask marks.

        `columns` may run past the mask (a buffer's free room): only marked ones are kept.
        """
        width = layers[0][0].shape[1]
        columns = attention_row[:width].nonzero().squeeze(1)
        if len(columns) != len(token_ids):
            return  # layout not understood: recompute next turn rather than risk a wrong cache
        layers = [(k.index_select(1, columns), v.index_select(1, columns)) for k, v in layers]
        self._put(session, list(token_ids), layers)

    def _put(
        self,
        session: Hashable,
        token_ids: list[int],
        layers: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> None:
        with self._lock:
            self._entries[session] = Entry(token_ids, layers)
            self._entries.move_to_end(session)
            while len(self._entries) > self.max_sessions:
                self._entries.popitem(last=False)


def shared_rows(
    prompts: Sequence[Sequence[int]], entries: Sequence[Entry | None]
) -> tuple[list[int], list[int]]:
    """Rows with the same prompt and nothing cached share one prefill row.

    A GRPO group's samples open with the same prompt: its prefill is computed once
    and its logits, keys and values copied to each sample's row, which a batch of
    64 samples of 8 prompts makes 8x cheaper. Returns, per request, its prefill
    row, and, per prefill row, the first request that has it.
    """
    rows: list[int] = []
    firsts: list[int] = []
    seen: dict[tuple[int, ...], int] = {}
    for i, (prompt, entry) in enumerate(zip(prompts, entries, strict=True)):
        key = tuple(prompt) if entry is None else None  # a cached session is its own row
        if key is not None and key in seen:
            rows.append(seen[key])
            continue
        if key is not None:
            seen[key] = len(firsts)
        rows.append(len(firsts))
        firsts.append(i)
    return rows, firsts


def per_request(rows: list[int], *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each request's row of `tensors`, computed once per prefill row (`shared_rows`)."""
    if len(rows) == tensors[0].shape[0]:  # no prompt was shared: the rows are the requests'
        return tensors
    index = torch.tensor(rows)
    return tuple(t.index_select(0, index.to(t.device)) for t in tensors)
