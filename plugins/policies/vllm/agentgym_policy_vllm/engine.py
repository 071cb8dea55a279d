"""One thread that owns a vLLM engine and steps it while requests are running.

Episodes call `submit` from their event loop; the request joins vLLM's
running batch at the next step (continuous batching: a short answer leaves
the batch as soon as it ends, a new request enters without waiting for the
others). Weight syncs and other engine calls go through `call`, so they run
between two steps, never during one; `run` is `submit` for a caller outside
any event loop (the probe after a sync). With nothing running, the thread
blocks on its inbox: no polling.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class _Waiter:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    if future.done():  # the episode was cancelled meanwhile
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _answer(
    waiter: _Waiter | concurrent.futures.Future, result: Any, error: BaseException | None = None
) -> None:
    """Hand a result to the waiting episode's loop (gone if that run already ended)."""
    if isinstance(waiter, concurrent.futures.Future):  # a blocked thread (`run`)
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(result)
        return
    with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
        waiter.loop.call_soon_threadsafe(_settle, waiter.future, result, error)


class EngineThread:
    """Feeds an in-process `vllm.v1.engine.llm_engine.LLMEngine` from any event loop."""

    def __init__(self, engine: Any, prompt_type: Callable[..., Any]) -> None:
        self.engine = engine
        self._prompt_type = prompt_type
        self._inbox: queue.SimpleQueue[tuple[str, Any, Any]] = queue.SimpleQueue()
        self._ids = itertools.count()
        self._waiting: dict[str, _Waiter | concurrent.futures.Future] = {}
        self.steps = 0
        self.batch_sizes: list[int] = []
        """Requests running at each step, for throughput reports."""
        self.error: BaseException | None = None
        """Why the engine stopped working, once a step has failed."""
        self._thread = threading.Thread(target=self._run, name="vllm-engine", daemon=True)
        self._thread.start()

    async def submit(self, prompt_ids: list[int], sampling: Any) -> Any:
        """Generate for one request; returns vLLM's finished `RequestOutput`."""
        if self.error is not None or not self._thread.is_alive():
            raise RuntimeError("the vLLM engine has stopped") from self.error
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop, loop.create_future())
        request_id = f"agentgym-{next(self._ids)}"
        self._inbox.put(("generate", request_id, (prompt_ids, sampling, waiter)))
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._inbox.put(("abort", request_id, None))
            raise

    def run(self, prompt_ids: list[int], sampling: Any) -> Any:
        """`submit`, blocking the calling thread instead of awaiting."""
        if self.error is not None or not self._thread.is_alive():
            raise RuntimeError("the vLLM engine has stopped") from self.error
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(("generate", f"agentgym-{next(self._ids)}", (prompt_ids, sampling, done)))
        return done.result()

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """`fn(engine)` in the engine thread between two steps; blocks until it returns."""
        if not self._thread.is_alive():
            raise RuntimeError("the vLLM engine has stopped") from self.error
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._inbox.put(("call", fn, done))
        return done.result()

    def stop(self) -> None:
        """End the thread after the current step; running requests fail."""
        if self._thread.is_alive():
            self._inbox.put(("stop", None, None))
            self._thread.join(timeout=30)

    # -- the thread ------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            busy = self.engine.has_unfinished_requests()
            try:
                item = self._inbox.get(block=not busy)
            except queue.Empty:
                item = None
            while item is not None:
                if item[0] == "stop":
                    self._fail_all(RuntimeError("the vLLM policy was closed"))
                    return
                self._handle(*item)
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    item = None
            if self.engine.has_unfinished_requests() and not self._step():
                return

    def _handle(self, kind: str, key: Any, payload: Any) -> None:
        if kind == "generate":
            prompt_ids, sampling, waiter = payload
            try:
                prompt = self._prompt_type(prompt_token_ids=prompt_ids)
                self.engine.add_request(key, prompt, sampling)
            except Exception as error:  # noqa: BLE001 - a bad request fails alone
                _answer(waiter, None, error)
            else:
                self._waiting[key] = waiter
        elif kind == "abort" and self._waiting.pop(key, None) is not None:
            self.engine.abort_request([key])
        elif kind == "call":
            try:
                payload.set_result(key(self.engine))
            except Exception as error:  # noqa: BLE001 - re-raised in the caller's thread
                payload.set_exception(error)

    def _step(self) -> bool:
        """One engine step; False when the engine failed (every waiting episode gets the error)."""
        self.batch_sizes.append(len(self._waiting))
        try:
            outputs = self.engine.step()
        except Exception as error:  # noqa: BLE001 - the engine is unusable: fail every episode
            self.error = error
            self._fail_all(error)
            return False
        self.steps += 1
        for output in outputs:
            if output.finished and output.request_id in self._waiting:
                _answer(self._waiting.pop(output.request_id), output)
        return True

    def _fail_all(self, error: BaseException) -> None:
        for waiter in self._waiting.values():
            _answer(waiter, None, error)
        self._waiting.clear()
