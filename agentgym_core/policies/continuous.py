"""Token-level continuous batching for the `hf` policy (`batching: continuous`).

With static batching a batch runs until its longest request finishes, and a
request that arrives meanwhile waits for the whole batch. Here one worker
thread keeps a running batch: before every decode step it admits the waiting
requests (prefilling only their uncached tails, as `PrefixCache` does), and
after every step the finished requests leave it and are answered at once, so
their episodes step their environments while the others still decode.

Rows of the running batch have caches of different lengths, laid out as in
`prefix_cache`: left-padded columns masked out, explicit position ids. Rows
that join are left-padded to the batch's width (or the batch to theirs);
columns no live row uses are cut off after rows leave. The keys sit in buffers
with free columns that each step writes into (`GrowingLayer`), in float32 where
`kv_cache_dtype: auto` says so: joining and leaving copy the cache, a decode
step does not. Sampling is the static
path's (`sampling.Sampler`, per-request Gumbel-max seeds), so the tokens do
not depend on which requests shared a step.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache

from agentgym_core.policies.growing_cache import GrowingLayer
from agentgym_core.policies.prefix_cache import PrefixCache, per_request, shared_rows
from agentgym_core.policies.sampling import Request, Sampler

STOP = None
"""Put on the request queue to end the worker."""


@dataclass
class RunningBatch:
    """The live rows: their requests, per-layer keys and values, mask and positions.

    Each layer's keys and values sit in buffers with free columns after the `width`
    used ones, where every decode step writes its token in place (`GrowingLayer`):
    a step does not copy the cache, as concatenating at every token did. Rows
    joining or leaving copy it once.
    """

    requests: list[Request]
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # [rows, heads, capacity, dim] each
    attention: torch.Tensor  # [rows, width], 1 where a column holds a real token
    position: torch.Tensor  # [rows, 1], the position of each row's last fed token
    pending: torch.Tensor  # [rows], each row's last sampled token, fed next step

    @property
    def width(self) -> int:
        """Columns of the cache in use (cached, fed and padding)."""
        return int(self.attention.shape[1])

    @property
    def capacity(self) -> int:
        """Columns of the buffers: in use and free."""
        return int(self.layers[0][0].shape[2])

    def join(self, other: RunningBatch, room: int) -> RunningBatch:
        """Both batches' rows in one, each right-aligned to the wider's width, `room` free."""
        if not self.requests:
            return other.with_room(room)
        width = max(self.width, other.width)
        layers = [
            _buffers([(k1[:, :, : self.width], v1[:, :, : self.width]), (k2, v2)], width, room)
            for (k1, v1), (k2, v2) in zip(self.layers, other.used_layers(), strict=True)
        ]
        return RunningBatch(
            self.requests + other.requests,
            layers,
            torch.cat([_pad_columns(self.attention, width), _pad_columns(other.attention, width)]),
            torch.cat([self.position, other.position]),
            torch.cat([self.pending, other.pending]),
        )

    def keep(self, rows: list[int]) -> RunningBatch:
        """Only `rows`, without the leading columns none of them uses; the free room kept."""
        index = torch.tensor(rows, dtype=torch.long)
        attention = self.attention.index_select(0, index)
        used = attention.any(dim=0).nonzero()
        start = int(used[0]) if len(used) else attention.shape[1]
        columns = slice(start, self.width)
        layers = [  # row by row, views: each kept column is copied once
            _buffers(
                [(k[row : row + 1, :, columns], v[row : row + 1, :, columns]) for row in rows],
                self.width - start,
                self.capacity - self.width,
            )
            for k, v in self.layers
        ]
        return RunningBatch(
            [self.requests[row] for row in rows],
            layers,
            attention[:, start:],
            self.position.index_select(0, index),
            self.pending.index_select(0, index),
        )

    def with_room(self, room: int) -> RunningBatch:
        """These rows in buffers with at least `room` free columns (copied only if short)."""
        if self.capacity - self.width >= room:
            return self
        layers = [_buffers([kv], self.width, room) for kv in self.used_layers()]
        return RunningBatch(self.requests, layers, self.attention, self.position, self.pending)

    def used_layers(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys and values over the columns in use (views)."""
        return [(k[:, :, : self.width], v[:, :, : self.width]) for k, v in self.layers]


def _buffers(
    parts: list[tuple[torch.Tensor, torch.Tensor]], width: int, room: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """New buffers holding `parts`' keys and values, stacked by row.

    Each part ([rows, heads, columns, dim]) right-aligned to `width` columns, then
    `room` free columns.
    """
    keys, values = parts[0]
    rows = sum(k.shape[0] for k, _ in parts)
    out_keys = keys.new_zeros((rows, keys.shape[1], width + room, keys.shape[3]))
    out_values = values.new_zeros((rows, values.shape[1], width + room, values.shape[3]))
    row = 0
    for k, v in parts:
        n, used = k.shape[0], k.shape[2]
        out_keys[row : row + n, :, width - used : width] = k
        out_values[row : row + n, :, width - used : width] = v
        row += n
    return out_keys, out_values


def _pad_columns(tensor: torch.Tensor, width: int) -> torch.Tensor:
    missing = width - tensor.shape[1]
    if missing == 0:
        return tensor
    return torch.cat([tensor.new_zeros((tensor.shape[0], missing)), tensor], dim=1)


def _layers(cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _answer(request: Request, result: Any = None, error: BaseException | None = None) -> None:
    """Resolve a request's future on its event loop (this runs on the worker thread)."""

    def resolve() -> None:
        if request.future.done():
            return
        if error is not None:
            request.future.set_exception(error)
        else:
            request.future.set_result(result)

    request.loop.call_soon_threadsafe(resolve)


class ContinuousDecoder:
    """The worker of one `hf` policy: admits, decodes one token for all, releases.

    It shares the policy's model, sampler and prefix cache, and appends the
    size of every forward pass to the policy's `batch_sizes`.
    """

    def __init__(
        self,
        model: Any,
        sampler: Sampler,
        cache: PrefixCache,
        *,
        max_batch_size: int,
        prefix_cache: bool,
        batch_sizes: list[int],
    ) -> None:
        self.model = model
        self.sampler = sampler
        self.cache = cache
        self.max_batch_size = max_batch_size
        self.prefix_cache = prefix_cache
        """Whether finished rows keep their KV state for the episode's next turn."""
        self.batch_sizes = batch_sizes
        self.requests: queue.Queue[Request | None] = queue.Queue()
        self.batch: RunningBatch | None = None
        self._was_training = False
        self._serving = False
        self.joined = 0
        """Requests admitted while other rows were decoding (the point of this mode)."""

    def submit(self, request: Request) -> None:
        """Queue a request (from the event loop)."""
        self.requests.put(request)

    def stop(self) -> None:
        """End `run` after its current step."""
        self.requests.put(STOP)

    @torch.no_grad()
    def run(self) -> None:
        """Serve until `stop()`: the body of the policy's generation thread."""
        while True:
            arrived = self._arrivals()
            if arrived is STOP:
                return
            try:
                if arrived:
                    self._admit(arrived)
                self._release_finished()
                if self.batch is not None:
                    self._decode_step()
                    self._release_finished()
            except Exception as error:  # noqa: BLE001 - forwarded to every waiting episode
                for request in (self.batch.requests if self.batch else []) + arrived:
                    _answer(request, error=error)
                self._end_batch()

    def _end_batch(self) -> None:
        """No row is live: the model goes back to the mode the learner left it in."""
        if self.batch is not None or self._serving:
            self.model.train(self._was_training)
        self.batch, self._serving = None, False

    def _arrivals(self) -> list[Request] | None:  # None: STOP
        """The waiting requests that fit (blocking only while nothing is running)."""
        room = self.max_batch_size - (len(self.batch.requests) if self.batch else 0)
        arrived: list[Request] = []
        if self.batch is None:
            first = self.requests.get()
            if first is STOP:
                return STOP
            arrived.append(first)
        while len(arrived) < room:
            try:
                request = self.requests.get_nowait()
            except queue.Empty:
                break
            if request is STOP:
                self.requests.put(STOP)  # served after the running rows finish
                break
            arrived.append(request)
        return arrived

    def _admit(self, arrived: list[Request]) -> None:
        """Prefill the new requests and sample their first tokens; they join the batch."""
        if not self._serving:
            self._was_training, self._serving = self.model.training, True
            self.model.eval()
        device = next(self.model.parameters()).device
        use_cache = self.prefix_cache
        entries = [self.cache.lookup(r.session, r.prompt) if use_cache else None for r in arrived]
        rows, firsts = shared_rows([r.prompt for r in arrived], entries)  # a group's prompt once
        pre = self.cache.prefill(
            [arrived[i].prompt for i in firsts], [entries[i] for i in firsts], self.sampler.pad_id
        )
        out = self.model(
            input_ids=pre.input_ids.to(device),
            attention_mask=pre.attention_mask.to(device),
            position_ids=pre.position_ids.to(device),
            past_key_values=pre.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        # each request's row of its prompt's prefill: logits, keys, values, mask, position
        logits, attention, position = per_request(
            rows, out.logits[:, -1, :], pre.attention_mask, pre.position_ids[:, -1:]
        )
        layers = [per_request(rows, k, v) for k, v in _layers(out.past_key_values)]
        for request in arrived:
            request.generator = self.sampler.generator(request.params, device)
        self.batch_sizes.append(len(arrived))
        next_ids, _ = self.sampler.sample(arrived, logits.float(), [r.generator for r in arrived])
        joined = RunningBatch(
            list(arrived),
            layers,
            attention.to(device),
            position.to(device),
            next_ids.to(device),
        )
        live = arrived + (self.batch.requests if self.batch is not None else [])
        room = max(r.params.max_new_tokens - len(r.tokens) for r in live) + 1
        if self.batch is not None:
            self.joined += len(arrived)
        self.batch = joined.with_room(room) if self.batch is None else self.batch.join(joined, room)

    def _decode_step(self) -> None:
        """Feed every live row's pending token; sample the next."""
        batch = self.batch
        assert batch is not None
        if batch.capacity == batch.width:  # out of room: double
            batch = batch.with_room(batch.width)
        ones = batch.attention.new_ones((len(batch.requests), 1))
        attention = torch.cat([batch.attention, ones], dim=1)
        position = batch.position + 1
        # the whole buffers are attended, the free columns masked (`GrowingLayer`, whole)
        free = attention.new_zeros((len(batch.requests), batch.capacity - batch.width - 1))
        mask = torch.cat([attention, free], dim=1)
        cache = Cache(layers=[GrowingLayer.over(k, v, batch.width) for k, v in batch.layers])
        out = self.model(
            input_ids=batch.pending.unsqueeze(1),
            attention_mask=mask,
            position_ids=position,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.batch_sizes.append(len(batch.requests))
        requests = batch.requests
        for request in requests:
            request.fed += 1
        generators = [r.generator for r in requests]
        next_ids, _ = self.sampler.sample(requests, out.logits[:, -1, :].float(), generators)
        pending = next_ids.to(attention.device)
        self.batch = RunningBatch(requests, batch.layers, attention, position, pending)

    def _release_finished(self) -> None:
        """Answer the finished rows, keep their KV state for the episode's next turn."""
        batch = self.batch
        if batch is None:
            return
        live = [row for row, request in enumerate(batch.requests) if not request.done]
        if len(live) == len(batch.requests):
            return
        for row, request in enumerate(batch.requests):
            if not request.done:
                continue
            if self.prefix_cache and request.session is not None:
                tokens = request.prompt + request.tokens[: request.fed]
                self.cache.store_row(
                    request.session,
                    tokens,
                    [(k[row], v[row]) for k, v in batch.layers],
                    batch.attention[row],
                )
            _answer(request, self.sampler.result(request))
        if live:
            self.batch = batch.keep(live)
        else:
            self._end_batch()
