"""The `hf` policy's one-token decode step through `torch.compile` (`compile_decode`).

A decoded token's forward pass on a GPU is a few hundred small kernels, and at
0.5B the time goes to launching them from Python, not to running them. Under
`mode="reduce-overhead"` the compiled step is replayed as one CUDA graph, which
needs every input at a fixed shape and address from one step to the next, and
from one batch to the next (a new shape or a new buffer records a new graph).
So the step runs on buffers this class keeps for the policy's lifetime:

- each layer's keys and values, [max_batch_size, heads, capacity, dim], held by
  transformers' `StaticLayer`s (written in place at the cache's running length,
  a tensor; their addresses are marked static);
- every batch padded to `max_batch_size` rows (a padding row attends to its
  column 0 and is never read) and its mask to `capacity` columns (zeros over
  columns it does not use). `capacity` doubles when a batch needs more, which
  compiles the step once more.

A batch's prefill still runs uncompiled on the growing cache (`growing_cache`);
its keys and values are then copied into these buffers once. The tokens and
log-probs equal the uncompiled path's: masked columns get zero weight.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, StaticLayer

MIN_CAPACITY = 256
"""Columns of the first buffers (the smallest graph's width)."""


def next_token_logits(
    model: Any, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, cache
) -> torch.Tensor:
    """One decode step: the logits [rows, vocab] after `input_ids` [rows] (written to `cache`)."""
    out = model(
        input_ids=input_ids.unsqueeze(1),
        attention_mask=attention,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1, :]


class CompiledDecode:
    """Fixed buffers and a compiled one-token step, reused by every batch of one policy."""

    def __init__(self, model: Any, rows: int, backend: str | None = None) -> None:
        self.model = model
        self.rows = rows
        """Rows of every step: the policy's `max_batch_size`."""
        self.backend = backend
        """`torch.compile`'s backend; None: inductor, with CUDA graphs on a GPU."""
        self.cache: Cache | None = None
        self.capacity = 0
        self._step = None

    def start(
        self, cache: Cache, attention: torch.Tensor, positions: torch.Tensor, room: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy a prefilled batch's keys and values in, for `room` tokens to be decoded.

        `cache`'s layers hold the batch's keys and values ([batch, heads, width, dim]),
        `attention` ([batch, width]) their mask, `positions` ([batch, 1]) each row's last.
        Returns both padded to [rows, capacity] and [rows, 1], for `step`.
        """
        batch, width = attention.shape
        if batch > self.rows:
            raise ValueError(f"a batch of {batch} rows; compiled decoding has {self.rows}")
        self._ensure(cache, width + room)
        assert self.cache is not None
        for static, layer in zip(self.cache.layers, cache.layers, strict=True):
            static.keys[:batch, :, :width] = layer.keys
            static.values[:batch, :, :width] = layer.values
            static.cumulative_length.fill_(width)
        padded = attention.new_zeros((self.rows, self.capacity))
        padded[:batch, :width] = attention
        padded[batch:, 0] = 1  # padding rows: one column, so no row's softmax is empty
        last = positions.new_zeros((self.rows, 1))
        last[:batch] = positions
        return padded, last

    def step(
        self, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """The logits [rows, vocab] of the next token after `input_ids` (one per live row).

        `attention` and `positions` as `start` returned them, updated for this token.
        Valid until the next step (a CUDA graph's output is overwritten by its next replay).
        """
        ids = input_ids.new_zeros(self.rows)
        ids[: len(input_ids)] = input_ids
        if self._step is None:
            options = {"backend": self.backend} if self.backend else {}
            if not self.backend and attention.device.type == "cuda":
                options["mode"] = "reduce-overhead"
            self._step = torch.compile(self._forward, dynamic=False, **options)
        if attention.device.type == "cuda":
            torch.compiler.cudagraph_mark_step_begin()
        return self._step(ids, attention, positions, self.cache)

    def batch_cache(self, batch: int) -> Cache:
        """The first `batch` rows' keys and values (views), for the prefix cache to copy out."""
        assert self.cache is not None
        layers = []
        for static in self.cache.layers:
            view = StaticLayer(self.capacity)
            view.keys, view.values = static.keys[:batch], static.values[:batch]
            view.is_initialized = True
            layers.append(view)
        return Cache(layers=layers)

    def _forward(
        self, input_ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, cache
    ) -> torch.Tensor:
        return next_token_logits(self.model, input_ids, attention, positions, cache)

    def _ensure(self, cache: Cache, width: int) -> None:
        """Buffers with at least `width` columns, shaped and typed like `cache`'s layers."""
        if self.cache is not None and width <= self.capacity:
            return
        capacity = max(MIN_CAPACITY, self.capacity)
        while capacity < width:
            capacity *= 2
        self.cache = None  # the old buffers go before the new ones are made
        layers = []
        for layer in cache.layers:
            static = StaticLayer(capacity)
            keys, values = layer.keys, layer.values
            # shaped [rows, heads, 0, dim]: lazy_initialization reads rows, heads, dim, dtype
            static.lazy_initialization(
                keys.new_empty((self.rows, keys.shape[1], 0, keys.shape[3])),
                values.new_empty((self.rows, values.shape[1], 0, values.shape[3])),
            )
            layers.append(static)
        self.cache, self.capacity = Cache(layers=layers), capacity
