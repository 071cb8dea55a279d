"""Noticing that a `vllm serve` replica restarted between two turns.

A replica restarted by its supervisor comes back with the weights it was
started from, not the learner's, and its first request succeeds as if
nothing happened. Each vLLM server process has an `instance_id` of its own
(`/server_info`, a dev-mode route, as the reload routes the policy needs),
so a changed id means a new process. Asking costs a request, so it is asked
only of a replica that answered nothing for `gap_s`: a restart takes far
longer than that (vLLM loads a model and warms up), and a replica answering
turns all along has not restarted.
"""

from __future__ import annotations

import threading
import time
from typing import Any

GAP_S = 5.0
"""A replica silent this long is asked whether it is still the same process."""


class Restarts:
    """Each replica's vLLM instance id, and when it last answered."""

    def __init__(self, http: Any, gap_s: float = GAP_S) -> None:
        self.http, self.gap_s = http, gap_s
        self.ids: dict[str, str | None] = {}
        self._answered: dict[str, float] = {}
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self.noticed = 0
        """Restarts noticed (their replicas were given the current weights)."""

    def answered(self, url: str) -> None:
        """`url` just answered a request."""
        self._answered[url] = time.monotonic()

    def record(self, url: str) -> None:
        """Remember the id of the process now serving `url` (after a reload)."""
        self.ids[url] = self.instance_id(url)
        self.answered(url)

    def due(self, url: str) -> bool:
        """Whether `url` has been silent long enough to be asked."""
        return self.ids.get(url) is not None and (
            time.monotonic() - self._answered.get(url, 0.0) > self.gap_s
        )

    def lock(self, url: str) -> threading.Lock:
        """Held while one turn checks `url` (and reloads it): the others wait, then skip."""
        with self._guard:
            return self._locks.setdefault(url, threading.Lock())

    def restarted(self, url: str) -> bool:
        """Whether another process serves `url` than at the last `record`."""
        now = self.instance_id(url)
        self.answered(url)
        return now != self.ids.get(url)

    def instance_id(self, url: str) -> str | None:
        """The vLLM process's instance id; None where `/server_info` is not served."""
        response = self.http.get(f"{url}/server_info", params={"config_format": "json"})
        if response.status_code == 404:
            return None
        response.raise_for_status()
        config = response.json().get("vllm_config")
        return str(config.get("instance_id")) if isinstance(config, dict) else None
