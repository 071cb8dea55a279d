"""`GrowingLayer`: decoding writes keys and values in place, with what DynamicCache gives."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from agentgym_core.policies.growing_cache import GrowingLayer, growing


def test_decoding_into_a_growing_cache_gives_dynamic_caches_logits_without_copying(tiny_model):
    model, _ = tiny_model
    model.eval()
    prompt = torch.tensor([[5, 9, 11, 3, 7, 2], [4, 4, 8, 1, 6, 3]])
    with torch.no_grad():
        plain = model(input_ids=prompt, use_cache=True)
        grown = model(input_ids=prompt, use_cache=True)
        cache = growing(grown.past_key_values, room=4)
        buffers = [layer._key_buffer.data_ptr() for layer in cache.layers]
        dynamic = plain.past_key_values
        assert isinstance(dynamic, DynamicCache)
        for step in range(4):
            token = torch.tensor([[step + 3], [step + 5]])
            position = torch.full((2, 1), prompt.shape[1] + step)
            a = model(input_ids=token, position_ids=position, past_key_values=dynamic)
            b = model(input_ids=token, position_ids=position, past_key_values=cache)
            torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=1e-6)
    assert [layer._key_buffer.data_ptr() for layer in cache.layers] == buffers  # no reallocation
    assert all(layer.keys.shape[-2] == prompt.shape[1] + 4 for layer in cache.layers)


def test_a_full_or_replaced_layer_makes_room_again_and_keeps_its_tokens():
    layer = GrowingLayer()
    keys = torch.arange(2 * 1 * 3 * 2, dtype=torch.float32).reshape(2, 1, 3, 2)
    layer.update(keys, keys + 100)
    more = torch.full((2, 1, 5, 2), -1.0)
    k, v = layer.update(more, more)  # beyond its room: it grows
    assert torch.equal(k[..., :3, :], keys) and torch.equal(v[..., 3:, :], more)
    layer.keys, layer.values = k[:1], v[:1]  # rows picked out, as per_request does
    k, v = layer.update(more[:1, :, :1], more[:1, :, :1])
    assert k.shape == (1, 1, 9, 2) and torch.equal(k[0, :, :3], keys[0])
