"""One OpenEnv session: a WebSocket to `/ws`, one message and its reply at a time.

Infrastructure faults (no connection, a timeout, the server gone, a reply
that is not OpenEnv's) raise `OpenEnvServerError`, so the rollout engine ends
the episode as `env_error` and the run's outage handling (wait, replay)
takes over; the session is gone with its socket, and the next reset opens a
new one.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

from websockets.exceptions import WebSocketException
from websockets.sync.client import ClientConnection, connect


class OpenEnvServerError(RuntimeError):
    """The server could not be reached, did not answer in time, or answered an error."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        """OpenEnv's error code when the server sent one (VALIDATION_ERROR, ...)."""


CLOSE_WAIT_S = 2.0
"""After saying `close`, how long to wait for the server to hang up before hanging up first."""

_open: Counter[str] = Counter()
_open_lock = threading.Lock()
"""Sessions this process has open per server URL, for choosing the least busy replica."""


def ws_url(base_url: str) -> str:
    """`http://host:port` -> `ws://host:port/ws` (https -> wss)."""
    for plain, secure in (("http://", "ws://"), ("https://", "wss://")):
        if base_url.startswith(plain):
            base_url = secure + base_url[len(plain) :]
    return base_url + "/ws"


def http_url(base_url: str) -> str:
    """`ws://host:port` -> `http://host:port` (wss -> https), for the plain HTTP routes."""
    for plain, secure in (("http://", "ws://"), ("https://", "wss://")):
        if base_url.startswith(secure):
            base_url = plain + base_url[len(secure) :]
    return base_url


def _loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


def least_busy(urls: list[str]) -> str:
    """The URL with the fewest sessions open in this process (the first on a tie)."""
    with _open_lock:
        return min(urls, key=lambda url: _open[url])


class Session:
    """An open `/ws` session on one server."""

    def __init__(
        self, base_url: str, *, connect_timeout_s: float, timeout_s: float, max_message_mb: float
    ) -> None:
        self.base_url = base_url
        self.timeout_s = timeout_s
        url = ws_url(base_url)
        self._exit = contextlib.ExitStack()  # websockets >= 16 hands the connection out as one
        try:
            self._socket: ClientConnection | None = self._exit.enter_context(
                connect(
                    url,
                    open_timeout=connect_timeout_s,
                    max_size=int(max_message_mb * 1024 * 1024),
                    proxy=None
                    if _loopback(url)
                    else True,  # True: the environment's proxy settings
                    close_timeout=2,
                )
            )
        except (OSError, TimeoutError, WebSocketException) as error:
            raise OpenEnvServerError(f"cannot open a session on {url}: {error}") from error
        with _open_lock:
            _open[base_url] += 1

    @property
    def open(self) -> bool:
        """Not closed by us nor lost (a lost one is closed when its fault is seen)."""
        return self._socket is not None

    def exchange(self, kind: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one message, return its reply's `data`; an error reply raises with its code."""
        if self._socket is None:
            raise OpenEnvServerError(f"{self.base_url}: the session is closed")
        message: dict[str, Any] = {"type": kind}
        if data is not None:
            message["data"] = data
        try:
            self._socket.send(json.dumps(message))
            raw = self._socket.recv(timeout=self.timeout_s)
        except TimeoutError as error:
            self.close()
            raise OpenEnvServerError(
                f"{self.base_url}: no reply to {kind} within {self.timeout_s} s (env.timeout_s)"
            ) from error
        except (OSError, WebSocketException) as error:
            self.close()
            raise OpenEnvServerError(f"{self.base_url}: the session was lost: {error}") from error
        try:
            reply = json.loads(raw)
            reply_type, reply_data = reply["type"], reply.get("data", {})
        except (ValueError, KeyError, TypeError) as error:
            self.close()
            raise OpenEnvServerError(
                f"{self.base_url}: a reply that is not OpenEnv's: {str(raw)[:200]!r}"
            ) from error
        if reply_type == "error":
            code = reply_data.get("code") if isinstance(reply_data, dict) else None
            said = reply_data.get("message") if isinstance(reply_data, dict) else reply_data
            raise OpenEnvServerError(f"{self.base_url}: {kind}: {said} ({code})", code)
        if not isinstance(reply_data, dict):
            raise OpenEnvServerError(f"{self.base_url}: {kind}: reply data is not an object")
        return reply_data

    def close(self) -> None:
        """Say close and hang up (best effort; idempotent)."""
        socket, self._socket = self._socket, None
        if socket is None:
            return
        with _open_lock:
            _open[self.base_url] -= 1
        try:  # the server ends the connection itself after `close`: wait for it to
            socket.send(json.dumps({"type": "close"}))
            socket.recv(timeout=CLOSE_WAIT_S)
        except (OSError, TimeoutError, WebSocketException):
            pass
        with contextlib.suppress(OSError, WebSocketException):
            self._exit.close()
