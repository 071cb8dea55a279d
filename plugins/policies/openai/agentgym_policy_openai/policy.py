"""The `openai` policy: any OpenAI-compatible `/chat/completions` endpoint, for evaluation.

An API returns text, so this is a text-level policy (`agentgym_core.rollout.text`):
`agentgym eval` plays it with the same tasks, conversation and metrics as a
trained checkpoint, and a train stage rejects it at config time.

Requests share one HTTP connection pool per event loop and at most
`max_concurrency` are in flight; a backing-off request gives its slot up while
it waits. 408, 429 and 5xx answers, timeouts and dropped connections are
retried with exponential backoff and jitter; any other error fails at once
with the status and the server's message.
"""

from __future__ import annotations

import asyncio
import os
import random
import re
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar

import httpx

from agentgym_core.api import (
    IDLE_REUSE_S,
    ChatMessage,
    ConfigError,
    ContextWindowExceeded,
    Generation,
    Problem,
    SamplingParams,
)
from agentgym_policy_openai.config import OpenAIPolicyConfig

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
"""Answers worth another try: timeouts, rate limits, overloaded or restarting servers."""

_CONTEXT_LENGTH = re.compile(r"context.length|maximum context|context window|too long", re.I)


class EndpointError(RuntimeError):
    """The endpoint refused a request or gave an answer that is not a chat completion."""


class OpenAIPolicy:
    """Chat completions over HTTP: messages in, the action text out."""

    text_level: ClassVar[bool] = True
    tokenizer = None
    """No tokenizer: the server tokenizes (the token-level protocol is not available)."""

    def __init__(self, config: OpenAIPolicyConfig, *, model: Any = None, tokenizer: Any = None):
        self.config = config
        self.url = f"{config.base_url}/chat/completions"
        self.headers = {"Content-Type": "application/json"}
        if config.api_key_env is not None:
            key = os.environ.get(config.api_key_env)
            if not key:
                raise ConfigError(
                    [
                        Problem(
                            "policy.api_key_env",
                            f"environment variable {config.api_key_env} is not set (or empty); "
                            "export the API key there",
                        )
                    ]
                )
            self.headers["Authorization"] = f"Bearer {key}"
        self._rng = random.Random()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._slots: asyncio.Semaphore | None = None
        self.requests = 0
        """HTTP requests sent, retries included."""
        self.retries = 0

    # -- the text-level protocol ---------------------------------------------------

    async def chat(
        self,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        allowed_actions: Sequence[str] | None = None,
    ) -> str:
        """The model's next action, stripped of surrounding whitespace."""
        body = self.request_body(messages, params, allowed_actions)
        answer = await self._post(body)
        return _content(answer, self.url)

    def request_body(
        self,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        allowed_actions: Sequence[str] | None,
    ) -> dict[str, Any]:
        """The JSON of one `/chat/completions` request."""
        config = self.config
        chat = [dict(m) for m in messages]
        if config.system_prompt is not None:
            chat.insert(0, {"role": "system", "content": config.system_prompt})
        temperature = config.temperature
        if temperature is None:
            temperature = 0.0 if params.greedy else params.temperature
        body: dict[str, Any] = {
            "model": config.model,
            "messages": chat,
            "max_tokens": config.max_tokens or params.max_new_tokens,
            "temperature": temperature,
        }
        if config.send_seed and params.seed is not None:
            body["seed"] = params.seed % (2**31)  # many servers take a 32-bit seed
        if allowed_actions and config.allowed_actions == "structured_outputs":
            body["structured_outputs"] = {"choice": list(dict.fromkeys(allowed_actions))}
        body.update(config.extra_body)
        return body

    async def aclose(self) -> None:
        """Close the connection pool of the current event loop (the engine calls it at the end)."""
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client, self._slots, self._loop = None, None, None

    def close(self) -> None:
        """Forget the connection pool (`aclose` already closed it inside its loop)."""
        self._client, self._slots, self._loop = None, None, None

    # -- the token-level protocol: not available from a text API -----------------------

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        allowed_actions: Sequence[str] | None = None,
        *,
        session: Hashable | None = None,
    ) -> Generation:
        """Not available: an API answers text, never the sampled token ids."""
        raise TypeError(
            "the openai policy is text-level: it evaluates through `agentgym eval` and "
            "cannot produce token ids or log-probabilities for training"
        )

    def release(self, session: Hashable) -> None:
        """Nothing is kept per episode."""

    def sync_weights(self, model: Any) -> None:
        """Not available: the weights live behind the endpoint."""
        raise TypeError("the openai policy cannot load weights: they live behind the endpoint")

    # -- HTTP ------------------------------------------------------------------------------

    def _session(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        """The client and slots of the running event loop (each `asyncio.run` has its own)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._slots is None or self._loop is not loop:
            limits = httpx.Limits(
                max_connections=self.config.max_concurrency, keepalive_expiry=IDLE_REUSE_S
            )
            self._client = httpx.AsyncClient(
                headers=self.headers, timeout=self.config.timeout_s, limits=limits
            )
            self._slots = asyncio.Semaphore(self.config.max_concurrency)
            self._loop = loop
        return self._client, self._slots

    async def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        client, slots = self._session()
        attempts = self.config.max_retries + 1
        for attempt in range(attempts):
            async with slots:
                self.requests += 1
                try:
                    response = await client.post(self.url, json=body)
                except (httpx.TimeoutException, httpx.TransportError) as error:
                    failure, delay = f"{type(error).__name__}: {error}", None
                else:
                    if response.status_code == 200:
                        return _json(response, self.url)
                    if response.status_code not in RETRY_STATUS:
                        raise self._refusal(response)
                    failure = f"HTTP {response.status_code}: {_server_message(response)}"
                    delay = _retry_after(response)
            if attempt + 1 == attempts:
                raise EndpointError(f"{self.url} failed {attempts} times; last: {failure}")
            self.retries += 1
            await asyncio.sleep(self._backoff(attempt) if delay is None else delay)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _backoff(self, attempt: int) -> float:
        """Exponential delay with "equal jitter": between half and all of the capped delay."""
        ceiling = min(self.config.backoff_max_s, self.config.backoff_s * 2**attempt)
        return ceiling * (0.5 + 0.5 * self._rng.random())

    def _refusal(self, response: httpx.Response) -> Exception:
        message = _server_message(response)
        status = response.status_code
        if status == 400 and _CONTEXT_LENGTH.search(message):
            return ContextWindowExceeded(message)
        hint = ""
        if status in (401, 403):
            where = self.config.api_key_env
            hint = (
                f" (the key comes from the environment variable {where}: check it)"
                if where
                else " (no key was sent: set policy.api_key_env to the variable holding it)"
            )
        return EndpointError(f"{self.url} answered HTTP {status}: {message}{hint}")


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds from a `Retry-After: <seconds>` header (HTTP dates are left to our backoff)."""
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _server_message(response: httpx.Response) -> str:
    """`error.message` of an OpenAI-style error body, else the start of the body."""
    try:
        data = response.json()
    except ValueError:
        return response.text[:300] or response.reason_phrase
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and error.get("message"):
        return str(error["message"])
    if isinstance(error, str):
        return error
    if isinstance(data, dict) and data.get("detail"):
        return str(data["detail"])
    return response.text[:300]


def _json(response: httpx.Response, url: str) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError as error:
        raise EndpointError(f"{url} answered 200 with a body that is not JSON") from error
    if not isinstance(data, dict):
        raise EndpointError(f"{url} answered 200 with JSON that is not an object")
    return data


def _content(answer: dict[str, Any], url: str) -> str:
    """`choices[0].message.content`, with an error naming the missing field."""
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices:
        raise EndpointError(f"{url}: the response has no `choices` (got keys {sorted(answer)})")
    message = choices[0].get("message") if isinstance(choices[0], dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    if not isinstance(content, str):
        raise EndpointError(f"{url}: the response has no text at `choices[0].message.content`")
    return content.strip()
