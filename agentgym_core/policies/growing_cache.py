"""A KV cache that decodes in place: room for the turn's tokens is made once, not per token.

transformers' `DynamicCache` appends each decoded token's keys and values with
`torch.cat`, which copies the whole cache at every token: O(turn x context)
bytes per turn. A 20-turn episode's context reaches thousands of tokens, so on
a CPU that copying, not the model, dominated decoding. `GrowingLayer` keeps
each layer's keys and values in a buffer with room to spare and writes new
tokens into it; the keys the model attends over are a view of the filled part.
When the room runs out it doubles (one copy); `growing` gives a prefilled
cache exactly the room the turn needs, so a turn copies its cache once.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are views of buffers with room to grow."""

    def __init__(self) -> None:
        super().__init__()
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def make_room(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
        """Hold `keys` and `values` ([batch, heads, tokens, dim]) with `room` tokens free."""
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        filled = keys.shape[-2]
        shape = (*keys.shape[:-2], filled + room, keys.shape[-1])
        self._key_buffer = keys.new_empty(shape)
        self._value_buffer = values.new_empty((*shape[:-1], values.shape[-1]))
        self._key_buffer[..., :filled, :] = keys
        self._value_buffer[..., :filled, :] = values
        self.keys = self._key_buffer[..., :filled, :]
        self.values = self._value_buffer[..., :filled, :]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new tokens after the filled part; returns every token's keys and values."""
        new = key_states.shape[-2]
        if not self.is_initialized or self.keys.numel() == 0:
            self.make_room(key_states[..., :0, :], value_states[..., :0, :], new)
        filled = self.keys.shape[-2]
        buffer = self._key_buffer
        if (
            buffer is None
            or self.keys.data_ptr() != buffer.data_ptr()  # someone replaced the keys
            or self.keys.shape[:-2] != buffer.shape[:-2]
            or filled + new > buffer.shape[-2]
        ):
            self.make_room(self.keys, self.values, max(new, filled))
        self._key_buffer[..., filled : filled + new, :] = key_states
        self._value_buffer[..., filled : filled + new, :] = value_states
        self.keys = self._key_buffer[..., : filled + new, :]
        self.values = self._value_buffer[..., : filled + new, :]
        return self.keys, self.values


def growing(cache: Cache, room: int) -> Cache:
    """A cache holding `cache`'s keys and values (copied once) with `room` tokens free per layer."""
    layers = []
    for layer in cache.layers:
        grown = GrowingLayer()
        grown.make_room(layer.keys, layer.values, room)
        layers.append(grown)
    return Cache(layers=layers)
