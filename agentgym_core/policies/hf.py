"""The built-in `hf` policy: transformers generation that batches concurrent episodes.

Each live episode awaits `generate`; a single server task collects every
request pending at that moment into one batch, runs a left-padded prefill and
a KV-cached decode loop in a worker thread (so environments keep stepping),
then answers all of them (`batching: continuous` hands requests to
`continuous.ContinuousDecoder` instead). Both modes sample with
`sampling.Sampler`: per-request seeds (Gumbel-max), so the sample does not
depend on how requests happened to be batched. `compile_decode` runs the static
path's one-token step through torch.compile on fixed buffers (`compiled_decode`).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import threading
import time
import warnings
from collections.abc import Hashable, Sequence
from typing import Any

import torch
from transformers.cache_utils import Cache

from agentgym_core.heap import release_freed_memory
from agentgym_core.interfaces import SamplingParams
from agentgym_core.modeling.attention import cache_dtype
from agentgym_core.policies.compiled_decode import CompiledDecode, next_token_logits
from agentgym_core.policies.constraints import ActionConstraint
from agentgym_core.policies.continuous import ContinuousDecoder
from agentgym_core.policies.growing_cache import growing
from agentgym_core.policies.hf_config import HFPolicyConfig
from agentgym_core.policies.prefix_cache import Prefill, PrefixCache, per_request, shared_rows
from agentgym_core.policies.sampling import Request, Sampler
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.types import Generation


class HFPolicy:
    """Generation with a transformers causal LM, shared with the learner on one device."""

    computes_as_learner = True
    """Its log-probabilities differ from the learner's only by how requests were batched."""

    def __init__(self, config: HFPolicyConfig, *, model: Any, tokenizer: Any) -> None:
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.chat = ChatFormat(tokenizer, getattr(model, "generation_config", None))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.sampler = Sampler(self.chat, self.pad_id, config.seed)
        self._executor = generation_thread(config.num_threads)
        self._queue: asyncio.Queue[Request] | None = None
        self._server: asyncio.Task | None = None
        kv_dtype = cache_dtype(model) if _wider_cache_pays(config) else None
        self.cache = PrefixCache(config.max_sessions, kv_dtype)
        self.batch_sizes: list[int] = []
        """Size of every batch generated (continuous: of every forward pass)."""
        self.seconds: collections.Counter[str] = collections.Counter()
        """Generation-thread time by part (static batching), cumulative: `prefill` (a batch's
        first forward pass), `decode` (the one-token passes after it), `sampling` (masks and
        draws), `kv_cache` (gathering the sessions' keys and values into a batch and back)."""
        self._decoder: ContinuousDecoder | None = None
        self._decoder_thread: threading.Thread | None = None
        self._compiled_decode: CompiledDecode | None = None
        self._layout: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.compile_backend: str | None = None
        """`torch.compile`'s backend for `compile_decode`; None: inductor (tests: "eager")."""

    # -- public protocol -------------------------------------------------------

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        allowed_actions: Sequence[str] | None = None,
        *,
        session: Hashable | None = None,
    ) -> Generation:
        """Queue one request and wait for its batch to finish."""
        loop = asyncio.get_running_loop()
        if self.config.batching == "static":
            self._ensure_server(loop)
        constraint = None
        if allowed_actions is not None:
            actions = list(dict.fromkeys(allowed_actions))
            constraint = ActionConstraint(actions, [self.chat.action_tokens(a) for a in actions])
            longest = max(len(seq) for seq in constraint.sequences)
            params = dataclasses.replace(params, max_new_tokens=max(params.max_new_tokens, longest))
        request = Request(list(prompt_ids), params, constraint, loop.create_future(), session)
        request.loop = loop
        if self.config.batching == "continuous":
            self._continuous().submit(request)
        else:
            assert self._queue is not None
            self._queue.put_nowait(request)
        return await request.future

    def sync_weights(self, model: Any) -> None:
        """Load the learner's weights (nothing to copy when shared); cached keys become stale."""
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())
        self.cache.clear()

    def release(self, session: Hashable) -> None:
        """Drop the KV state of a finished episode."""
        self.cache.release(session)

    def counters(self) -> dict[str, float]:
        """For the run's metrics (`policy/<part>_seconds`): generation time by part, cumulative.

        Only times: counts kept by this process (batches, reused tokens) would differ
        between a resumed run and a straight one, whose metrics must agree.
        """
        return {f"{part}_seconds": seconds for part, seconds in self.seconds.items()}

    def close(self) -> None:
        """Stop the server task and the generation thread."""
        if self._server is not None and not self._server.done():
            self._server.cancel()
        self._server = None
        if self._decoder is not None:
            self._decoder.stop()
            self._decoder = None
        if self._decoder_thread is not None:
            # waited for: a thread still in torch when the interpreter exits aborts the process
            self._decoder_thread.join(timeout=CLOSE_WAIT_SECONDS)
            if self._decoder_thread.is_alive():
                warnings.warn(
                    f"the hf policy's continuous decoder was still running {CLOSE_WAIT_SECONDS} s "
                    "after close (its rows finish first); exiting now may abort the process",
                    stacklevel=2,
                )
            self._decoder_thread = None
        self._compiled_decode = None  # its buffers: every row's keys and values at capacity
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- batching ----------------------------------------------------------------

    def _continuous(self) -> ContinuousDecoder:
        """The continuous-batching worker, started on its own thread at first use."""
        if self._decoder is None:
            config = self.config
            self._decoder = ContinuousDecoder(
                self.model,
                self.sampler,
                self.cache,
                max_batch_size=config.max_batch_size,
                prefix_cache=config.prefix_cache,
                batch_sizes=self.batch_sizes,
            )
            # a daemon thread: a policy nobody closed must not keep the interpreter alive
            started = threading.Event()
            before = torch.get_num_threads()

            def run(decoder: ContinuousDecoder = self._decoder) -> None:
                if config.num_threads:
                    _own_threads(config.num_threads)
                started.set()
                decoder.run()

            self._decoder_thread = threading.Thread(target=run, name="hf-continuous", daemon=True)
            self._decoder_thread.start()
            started.wait()
            if config.num_threads:
                torch.set_num_threads(before)  # see generation_thread
        return self._decoder

    def _ensure_server(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._server is not None and not self._server.done() and self._server.get_loop() is loop:
            return
        self._queue = asyncio.Queue()
        self._server = loop.create_task(self._serve())

    async def _serve(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather()
            try:
                await loop.run_in_executor(self._executor, self._generate_batch, batch)
            except Exception as error:  # noqa: BLE001 - forwarded to every waiting episode
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(error)
                continue
            for request in batch:
                if not request.future.done():
                    request.future.set_result(self.sampler.result(request))

    async def _gather(self) -> list[Request]:
        """The next batch: the first request, and those that arrive close behind it.

        Episodes reset or stepped together send their requests a few ms apart (their
        env calls run in threads); without the wait the first one or two would run as
        a batch of their own and everyone else would wait a whole decode for them.
        """
        assert self._queue is not None
        batch = [await self._queue.get()]
        await asyncio.sleep(0)  # a yield, not a delay: lets just-woken episodes enqueue
        quiet = self.config.gather_ms / 1000
        while len(batch) < self.config.max_batch_size:
            if not self._queue.empty():
                batch.append(self._queue.get_nowait())
                continue
            if not quiet:
                break
            try:
                async with asyncio.timeout(quiet):  # not wait_for: see EnvThreads.call
                    batch.append(await self._queue.get())
            except TimeoutError:
                break
        return batch

    # -- the model -----------------------------------------------------------------

    @torch.no_grad()
    def _generate_batch(self, batch: list[Request]) -> None:
        self.batch_sizes.append(len(batch))
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        try:
            self._decode(batch, device)
        finally:
            self.model.train(was_training)
            if device.type == "cpu":
                release_freed_memory()

    def _decode(self, batch: list[Request], device: torch.device) -> None:
        """Prefill the requests' uncached tails in groups, then decode them together.

        Groups of similar tails (`prefill_groups`) each run their own forward pass into
        the batch's buffers; the decode is one loop over every row.
        """
        clock = _Clock(self.seconds, device)
        compiled = self._compiled(device)
        use_cache = self.config.prefix_cache
        # taken, not looked up: a session's old keys are freed once copied into the batch
        entries = [
            self.cache.lookup(r.session, r.prompt, take=True) if use_cache else None for r in batch
        ]
        # in arrival order: an unseeded request takes the sampler's next seed
        generators = [self.sampler.generator(r.params, device) for r in batch]
        order, sizes = self._in_groups(batch, entries, device)
        batch, entries = [batch[i] for i in order], [entries[i] for i in order]
        generators = [generators[i] for i in order]
        # a prompt several requests share is one prefill row
        rows, firsts = shared_rows([r.prompt for r in batch], entries)
        longest = max(r.params.max_new_tokens for r in batch)
        room = 0 if compiled else longest  # compiled: decoded into its own buffers
        pre = self.cache.prefill(
            [batch[i].prompt for i in firsts],
            [entries[i] for i in firsts],
            self.pad_id,
            room,
            self._kv_layout(device) if len(sizes) > 1 else None,
            sizes,
        )
        del entries  # the sessions' old keys: copied into the batch, freed while it decodes
        prefill_width = pre.attention_mask.shape[1] - room
        mask = pre.attention_mask.to(device)  # covering the room: zeros until a token is decoded
        clock.lap("kv_cache")
        logits = self._prefill(pre, sizes, mask, device)
        # each request's row of its prompt's prefill: logits, keys, values, mask, position
        logits, attention, last_position = per_request(
            rows, logits, mask, pre.position_ids[:, -1:].to(device)
        )
        cache = pre.cache  # decoded tokens are written in place, into the room it was made with
        if len(rows) != len(firsts):  # a shared prompt's rows were copied out: room made anew
            for layer in cache.layers:
                layer.keys, layer.values = per_request(rows, layer.keys, layer.values)
            if not compiled:
                cache = growing(cache, room=longest, whole=True)
        if compiled:
            attention, last_position = compiled.start(cache, attention, last_position, longest)
            del cache, pre
        clock.lap("prefill")
        live = len(batch)
        for step in range(longest):
            next_ids, real = self.sampler.sample(batch, logits.float(), generators)
            clock.lap("sampling")
            if all(r.done for r in batch):
                break
            attention[:live, prefill_width + step] = real.to(device)
            last_position = last_position + 1
            if compiled:
                logits = compiled.step(next_ids.to(device), attention, last_position)[:live]
            else:
                ids = next_ids.to(device)
                logits = next_token_logits(self.model, ids, attention, last_position, cache)
            clock.lap("decode")
        if use_cache:
            attention = attention[:live]
            if compiled:
                cache = compiled.batch_cache(live)
            # each row's prompt and the tokens fed back (a row's last sampled token never is)
            fed = attention[:, prefill_width:].sum(dim=1).tolist()
            self.cache.store(
                [r.session for r in batch],
                [r.prompt + r.tokens[: int(n)] for r, n in zip(batch, fed, strict=True)],
                cache,
                attention,
            )
            clock.lap("kv_cache")

    def _in_groups(
        self, batch: list[Request], entries: list[Any], device: torch.device
    ) -> tuple[list[int], list[int]]:
        """The requests in an order that puts each prefill group's rows together.

        Returns that order and the groups' sizes in prefill rows (`prefill_groups`).
        """
        cached = [len(e.token_ids) if e else 0 for e in entries]
        tails = [len(r.prompt) - n for r, n in zip(batch, cached, strict=True)]
        rows, firsts = shared_rows([r.prompt for r in batch], entries)
        groups = prefill_groups([tails[i] for i in firsts], self._split_above(device))
        group_of = {row: g for g, group in enumerate(groups) for row in group}
        order = sorted(range(len(batch)), key=lambda i: group_of[rows[i]])  # stable
        return order, [len(g) for g in groups]

    def _split_above(self, device: torch.device) -> int:
        """A group's cost in padded prefill positions (`split_prefill_tokens`); 0: one group."""
        wanted = self.config.split_prefill_tokens
        if wanted == "auto":
            return SPLIT_ABOVE_ON_CPU if device.type == "cpu" else 0
        return wanted

    def _prefill(
        self, pre: Prefill, sizes: list[int], mask: torch.Tensor, device: torch.device
    ) -> torch.Tensor:
        """The logits after each prefill row's last token, group by group.

        Each group's forward pass writes its keys into the batch's buffers in place. A
        group runs its own longest tail, not the batch's, and attends from the first
        column one of its rows has cached: a new episode's first prompt does not pad the
        others' observations, nor attend over their caches' width.
        """
        cached_width, new_width = max(pre.reused), pre.input_ids.shape[1]
        split = len(sizes) > 1
        logits, start = [], 0
        for size in sizes:
            rows = slice(start, start + size)
            start += size
            tail = max(pre.new[rows])
            first = cached_width - max(pre.reused[rows])
            cache = pre.cache  # one group: its buffers may still be made at the first write
            if split:
                filled = cached_width + new_width - tail - first
                cache = Cache(layers=[layer.group(rows, first, filled) for layer in cache.layers])
            out = self.model(
                input_ids=pre.input_ids[rows, new_width - tail :].to(device),
                attention_mask=mask[rows, first:],
                position_ids=pre.position_ids[rows, new_width - tail :].to(device),
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,  # only the last position is sampled from
            )
            logits.append(out.logits[:, -1, :])
            del out
        if split:
            for layer in pre.cache.layers:
                layer.fill(cached_width + new_width)
        return torch.cat(logits) if len(logits) > 1 else logits[0]

    def _kv_layout(self, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys and values of no token, [heads, 0, dim].

        So a batch's buffers can be made before any session has a cache: one token's
        forward pass, once.
        """
        if self._layout is None:
            was_training = self.model.training
            self.model.eval()
            with torch.no_grad():
                ids = torch.tensor([[self.pad_id]], device=device)
                out = self.model(input_ids=ids, use_cache=True)
            self.model.train(was_training)
            self._layout = [
                (layer.keys[0, :, :0], layer.values[0, :, :0])
                for layer in out.past_key_values.layers
            ]
        return self._layout

    def _compiled(self, device: torch.device) -> CompiledDecode | None:
        """The compiled decode step (`compile_decode`), made at the first batch; None: off."""
        wanted = self.config.compile_decode
        if wanted == "auto":
            wanted = device.type == "cuda"
        if not wanted:
            return None
        if self._compiled_decode is None:
            self._compiled_decode = CompiledDecode(
                self.model, self.config.max_batch_size, self.compile_backend
            )
        return self._compiled_decode


CLOSE_WAIT_SECONDS = 60
"""How long `close` waits for the continuous decoder to finish its running rows."""

SPLIT_ABOVE_ON_CPU = 32
"""`split_prefill_tokens: auto` on a CPU: what one more group's forward pass costs, in prefill
positions. 32 and 128 ran within 3% of each other, 512 gave back the gain (benchmarks/README.md,
prefill groups)."""


def prefill_groups(tails: Sequence[int], split_above: int) -> list[list[int]]:
    """Prefill rows (by uncached tail) in groups whose split saves `split_above` tokens each.

    A batch's prefill runs every row to the longest uncached tail: first prompts of
    300 to 700 tokens pad to 700, and one new episode's whole first prompt among
    episodes that add a hundred-token observation makes every row compute its
    length. Requests sorted by tail are cut into runs that minimise the tokens
    computed (rows x longest tail, summed) plus `split_above` for every group past
    the first: its own forward pass, which the saving must pay for (the groups then
    decode as one batch). Returns row indices, short tails first; `split_above` 0: one group. Equal
    tails always stay in one group (moving them to the earlier one costs less).
    """
    n = len(tails)
    if split_above <= 0 or n < 2:
        return [list(range(n))]
    order = sorted(range(n), key=lambda i: tails[i])
    # best[j]: least cost of the first j sorted requests; cut[j]: where its last group starts
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            cost = best[i] + (j - i) * tails[order[j - 1]] + (split_above if i else 0)
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], n
    while j > 0:
        groups.append(sorted(order[cut[j] : j]))
        j = cut[j]
    return groups[::-1]


def _wider_cache_pays(config: HFPolicyConfig) -> bool:
    """`kv_cache_dtype: auto` where the cache is written in place: not compiled.

    The compiled step's fixed buffers take the model's keys as they are.
    """
    return config.kv_cache_dtype == "auto" and config.compile_decode is not True


def generation_thread(threads: int) -> concurrent.futures.ThreadPoolExecutor:
    """The one thread that runs generation, with `threads` torch threads of its own (0: as now).

    `torch.set_num_threads` sets the calling thread's OpenMP count, but also the count
    new threads start with (a thread's first torch call takes it) and MKL's: so it is
    called on the generation thread, then on this one with the count of before, which
    restores those two.
    """
    executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="hf-gen")
    if threads:
        before = torch.get_num_threads()
        executor.submit(_own_threads, threads).result()
        torch.set_num_threads(before)
    return executor


def _own_threads(threads: int) -> None:
    torch.get_num_threads()  # torch's first call on a thread sets its count from the shared one
    torch.set_num_threads(threads)


class _Clock:
    """Adds the time since its last lap to a part's total.

    On a GPU it waits for the device at each lap: kernels run after their launch
    returns, so without the wait a forward pass's time would land in the next part.
    """

    def __init__(self, totals: collections.Counter[str], device: torch.device) -> None:
        self.totals = totals
        self.sync = torch.cuda.synchronize if device.type == "cuda" else None
        self.last = time.perf_counter()

    def lap(self, part: str) -> None:
        if self.sync is not None:
            self.sync()
        now = time.perf_counter()
        self.totals[part] += now - self.last
        self.last = now
