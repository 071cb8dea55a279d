"""A KV cache that decodes in place: room for the turn's tokens is made once, not per token.

transformers' `DynamicCache` appends each decoded token's keys and values with
`torch.cat`, which copies the whole cache at every token: O(turn x context)
bytes per turn. A 20-turn episode's context reaches thousands of tokens, so on
a CPU that copying, not the model, dominated decoding. `GrowingLayer` keeps
each layer's keys and values in a buffer with room to spare and writes new
tokens into it. With `whole=True` the model attends over the whole buffer, the
room masked out (as transformers' static cache does): a view of the filled part
is not contiguous, and PyTorch's CPU matrix products copy such a view first,
which made a decoded token's attention 3x slower in bfloat16. The caller then
passes a 2D attention mask that covers the buffer, zeros over the room (without
one, transformers drops the mask of a single query and the room would be
attended). Otherwise it attends over a view of the filled part. When the room
runs out it doubles (one copy). The prefix cache assembles a
batch's cached keys straight into such buffers (`GrowingLayer.zeros`), with room
for the new tail and the turn's tokens, so a turn copies its cache once
(`group`: a prefill group's rows of those buffers, written in place);
`growing` does the same for a cache that was made some other way.

The buffers may be wider than the model's keys (`dtype`): on a CPU without
bfloat16 instructions a bfloat16 model's cache is kept in float32
(`attention.cache_dtype`), each new token's keys converted once as written,
because there a decoded token's attention over a bfloat16 cache is emulated:
decoding was 4.4x slower than with float32 at 2,000 tokens of context
(`benchmarks/smollm2.py --long-turns`).
"""

from __future__ import annotations

import functools

import torch
from transformers.cache_utils import Cache, DynamicLayer


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` whose keys and values are views of buffers with room to grow."""

    def __init__(
        self, reserve: int = 0, whole: bool = False, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__()
        self.reserve = reserve
        """Room made beyond the tokens of an empty layer's first update."""
        self.whole = whole
        """Attend over the whole buffer: the caller's mask covers the room (module docstring)."""
        self.buffer_dtype = dtype
        """The buffers' dtype; None: the keys' own (module docstring)."""
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None
        self.borrowed = False
        """The buffers are another's (`over`, `group`): writes must land in them."""

    @classmethod
    def zeros(
        cls,
        rows: int,
        keys: torch.Tensor,
        values: torch.Tensor,
        filled: int,
        room: int,
        whole: bool = False,
        dtype: torch.dtype | None = None,
    ) -> GrowingLayer:
        """`rows` rows of `filled` zero tokens with `room` free, to be written in place.

        Shaped like `keys` and `values` ([heads, tokens, dim]), of `dtype` or theirs.
        """
        layer = cls(whole=whole, dtype=dtype)
        layer.lazy_initialization(keys, values)
        heads, _, dim = keys.shape
        layer._key_buffer = keys.new_zeros((rows, heads, filled + room, dim), dtype=dtype)
        layer._value_buffer = values.new_zeros(
            (rows, values.shape[0], filled + room, values.shape[2]), dtype=dtype
        )
        layer.keys = layer._key_buffer[..., :filled, :]
        layer.values = layer._value_buffer[..., :filled, :]
        return layer

    def make_room(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
        """Hold `keys` and `values` ([batch, heads, tokens, dim]) with `room` tokens free."""
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
        filled = keys.shape[-2]
        shape = (*keys.shape[:-2], filled + room, keys.shape[-1])
        dtype = self.buffer_dtype
        # zeros, not garbage: masked columns still enter the products, and NaN x 0 is NaN
        self._key_buffer = keys.new_zeros(shape, dtype=dtype)
        self._value_buffer = values.new_zeros((*shape[:-1], values.shape[-1]), dtype=dtype)
        self._key_buffer[..., :filled, :] = keys
        self._value_buffer[..., :filled, :] = values
        self.keys = self._key_buffer[..., :filled, :]
        self.values = self._value_buffer[..., :filled, :]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new tokens after the filled part.

        Returns the whole buffers when they had room for the tokens (`get_mask_sizes`
        promised the model a mask that wide), else the filled part, made room for.
        """
        new = key_states.shape[-2]
        fits = self._fits(new)
        if not fits and self.borrowed:  # new buffers of its own: the owner would never see them
            raise RuntimeError(
                f"a borrowed KV buffer has no room for {new} tokens "
                f"({self.keys.shape[-2]} of {self._key_buffer.shape[-2]} columns written)"
            )
        if not fits and (not self.is_initialized or self.keys.numel() == 0):  # first tokens
            self.make_room(key_states[..., :0, :], value_states[..., :0, :], new + self.reserve)
        elif not fits:  # out of room: double
            self.make_room(self.keys, self.values, max(new, self.keys.shape[-2]))
        filled = self.keys.shape[-2]
        self._key_buffer[..., filled : filled + new, :] = key_states
        self._value_buffer[..., filled : filled + new, :] = value_states
        self.keys = self._key_buffer[..., : filled + new, :]
        self.values = self._value_buffer[..., : filled + new, :]
        if self.whole and fits:
            return self._key_buffer, self._value_buffer
        return self.keys, self.values

    def group(self, rows: slice, first: int, filled: int) -> GrowingLayer:
        """A layer over rows `rows` of these buffers, from column `first` on.

        `filled` of its columns count as written. A prefill group writes its keys
        through it into the batch's buffers in place. Columns before `first` (keys none
        of the group's rows has) are left out of its attention. Once every group has
        written, `fill` moves this layer past them all.
        """
        keys, values = self._key_buffer[rows, :, first:], self._value_buffer[rows, :, first:]
        return GrowingLayer.over(keys, values, filled)

    @classmethod
    def over(cls, keys: torch.Tensor, values: torch.Tensor, filled: int) -> GrowingLayer:
        """A layer whose buffers are `keys` and `values`, the first `filled` columns written.

        Attended whole: the caller's mask covers the free columns.
        """
        layer = cls(whole=True, dtype=keys.dtype)
        layer.dtype, layer.device, layer.is_initialized = keys.dtype, keys.device, True
        layer._key_buffer, layer._value_buffer = keys, values
        layer.borrowed = True
        layer.keys = keys[..., :filled, :]
        layer.values = values[..., :filled, :]
        return layer

    def fill(self, filled: int) -> None:
        """Count the first `filled` columns as written (by `group` views)."""
        self.keys = self._key_buffer[..., :filled, :]
        self.values = self._value_buffer[..., :filled, :]

    def drop(self) -> None:
        """Free the buffers (their rows were copied out)."""
        self._key_buffer = self._value_buffer = None
        self.keys = self.values = None
        self.is_initialized = False

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """The mask's width: the whole buffer when the query fits in its room."""
        if self.whole and self._fits(query_length):
            return self._key_buffer.shape[-2], 0
        return super().get_mask_sizes(query_length)

    def _fits(self, new: int) -> bool:
        """The buffer holds the keys (nobody replaced them) with room for `new` tokens."""
        buffer = self._key_buffer
        keys = self.keys
        return (
            buffer is not None
            and self.is_initialized
            and keys.dim() == buffer.dim()
            # the same memory, compared by storage: a view of no column has no data pointer
            and keys.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
            and keys.storage_offset() == buffer.storage_offset()
            and keys.shape[:-2] == buffer.shape[:-2]
            and keys.shape[-2] + new <= buffer.shape[-2]
        )


def growing_layers(reserve: int, whole: bool = False, dtype: torch.dtype | None = None) -> Cache:
    """An empty cache whose layers, at their first update, make `reserve` tokens of room."""
    return Cache(layer_class_to_replicate=functools.partial(GrowingLayer, reserve, whole, dtype))


def growing(cache: Cache, room: int, whole: bool = False) -> Cache:
    """A cache holding `cache`'s keys and values (copied once) with `room` tokens free per layer.

    The buffers keep the keys' dtype.
    """
    layers = []
    for layer in cache.layers:
        grown = GrowingLayer(whole=whole)
        grown.make_room(layer.keys, layer.values, room)
        layers.append(grown)
    return Cache(layers=layers)
