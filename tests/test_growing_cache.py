"""`GrowingLayer`: decoding writes keys and values in place, with what DynamicCache gives."""

from __future__ import annotations

import pytest
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


def test_a_batch_of_cached_sessions_is_prefilled_and_decoded_in_the_buffers_it_was_built_in(
    tiny_model,
):
    """The prefix cache's batch has room for the tail and the turn: no copy of the cache
    after it is assembled, attention over the whole (contiguous) buffer with the room
    masked, and the logits of recomputing everything."""
    from agentgym_core.policies.prefix_cache import PrefixCache

    model, _ = tiny_model
    model.eval()
    store = PrefixCache()
    turns = [[5, 9, 11, 3, 7, 2, 8], [4, 4, 8, 1]]
    with torch.no_grad():
        for session, tokens in enumerate(turns):
            out = model(input_ids=torch.tensor([tokens]), use_cache=True)
            store.store([session], [tokens], out.past_key_values, torch.ones(1, len(tokens)))
        prompts = [turns[0] + [6, 3], turns[1] + [9, 9, 9]]
        entries = [store.lookup(s, p, take=True) for s, p in enumerate(prompts)]
        assert len(store) == 0  # taken: the old keys go once copied into the batch
        pre = store.prefill(prompts, entries, pad_id=0, room=2)
        buffers = [layer._key_buffer.data_ptr() for layer in pre.cache.layers]
        out = model(
            input_ids=pre.input_ids,
            attention_mask=pre.attention_mask,
            position_ids=pre.position_ids,
            past_key_values=pre.cache,
            use_cache=True,
        )
        attention, position = pre.attention_mask.clone(), pre.position_ids[:, -1:]
        width = attention.shape[1] - 2  # the mask covers the room: zeros until decoded into
        decoded = [list(p) for p in prompts]
        for step in range(2):
            assert pre.cache.get_mask_sizes(1, 0) == (attention.shape[1], 0)  # the whole buffer
            token = torch.tensor([[3 + step], [7]])
            for row, t in enumerate(token[:, 0].tolist()):
                decoded[row].append(t)
            attention[:, width + step] = 1
            position = position + 1
            out = model(
                input_ids=token,
                attention_mask=attention,
                position_ids=position,
                past_key_values=pre.cache,
                use_cache=True,
            )
            for row, tokens in enumerate(decoded):
                whole = model(input_ids=torch.tensor([tokens])).logits[0, -1]
                torch.testing.assert_close(out.logits[row, -1], whole, rtol=0, atol=1e-5)
    assert [layer._key_buffer.data_ptr() for layer in pre.cache.layers] == buffers
    assert all(layer.keys.shape[-2] == attention.shape[1] for layer in pre.cache.layers)


def test_group_views_write_into_the_batch_buffers_and_refuse_to_outgrow_them():
    """A prefill group writes its rows' keys through a view (from column `first`, `filled`
    written, zero columns included); `fill` then counts them; a view out of room raises
    rather than write into buffers of its own, which the batch would never see."""
    batch = GrowingLayer.zeros(3, torch.zeros(1, 0, 2), torch.zeros(1, 0, 2), 2, 4, whole=True)
    view = batch.group(slice(1, 3), first=1, filled=0)  # nothing written yet: a zero-width view
    new = torch.ones(2, 1, 3, 2)
    k, _ = view.update(new, new * 2)
    assert k.shape == (2, 1, 5, 2)  # the whole view (columns 1-5), the room included
    assert torch.equal(batch._key_buffer[1:3, :, 1:4], new)  # landed in the batch's buffers
    assert torch.equal(batch._value_buffer[1:3, :, 1:4], new * 2)
    assert batch._key_buffer[0].abs().sum() == 0  # the other group's row untouched
    batch.fill(4)
    assert batch.keys.shape[-2] == 4
    full = GrowingLayer.over(torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2), filled=2)
    with pytest.raises(RuntimeError, match="no room for 2 tokens"):
        full.update(torch.ones(1, 1, 2, 2), torch.ones(1, 1, 2, 2))
