"""HTTP to env servers: pooled connections, bounded concurrency, replicas, faults made exceptions.

AgentGym's servers report many errors as HTTP 200 with an `error` field, run
one worker (a slow step holds up every client), and forget every env id when
restarted. Every such fault becomes a `RemoteEnvError` here, so the rollout
engine records the episode as `env_error` instead of scoring it.

A restart quick enough that no request fails is caught too: `agentgym
serve-env` names its life in an `X-AgentGym-Instance` header on every reply
(a new one per start), and servers that count ids from 0 (AgentGym's) hand
out again an id that this client still holds. Either way every env id of
that replica is marked stale, so no episode goes on in an id that may now be
someone else's; each restart is counted (`ServerPool.restarts`) and logged.

A replica that stops answering (a refused or dropped connection) gets no new
env ids until a probe (a GET of its root, every `PROBE_EVERY_S`, any HTTP
answer will do) or a request finds it up again, so a restarted server is used
again as soon as it answers, and a dead one is not tried again by episodes:
an id held there is dropped at the env's next reset, which starts on a
replica that is up. A probe's reply also shows a restart, so the old life's
ids are stale before an episode sends one. On a server that names its life,
one lost connection ends only the episode whose request it carried; without
the header it marks every id held there stale.
`ServerPool.counters` gives, per replica, the env ids opened, the requests
that failed and the seconds it was down, for the run's metrics.
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentgym_core.api import IDLE_REUSE_S

INVALID_ID = re.compile(r"\bid\b.*\bnot valid\b", re.IGNORECASE)
"""AgentGym's reply to an id it does not know: `{"error": "The id 99 is not valid."}`."""
CLOSE_TIMEOUT_S = 5.0
"""Closing is best effort: never wait long on a server that may be gone."""
PROBE_EVERY_S = 0.5
"""How often a replica found down is probed; new env ids avoid it (if others are up) till then."""
PROBE_TIMEOUT_S = 2.0
"""A probe's own time limit: a replica that takes longer is still down."""
INSTANCE_HEADER = "X-AgentGym-Instance"
"""`agentgym serve-env`'s header naming the server's life; random per start."""

log = logging.getLogger(__name__)


class RemoteEnvError(RuntimeError):
    """An env server failed: an error reply, a timeout, a dropped connection, a bad reply."""


class SessionLost(RemoteEnvError):
    """The server no longer knows our env id: it restarted, or reaped the id when idle."""


class ServerUnreachable(RemoteEnvError):
    """The replica refused or dropped the connection; it is marked down until it answers again."""


class ServerRestarted(SessionLost):
    """The server answering is not the life that handed out our env id: it restarted."""


@dataclass
class _Server:
    url: str
    client: httpx.Client
    slots: threading.BoundedSemaphore
    open_ids: int = 0
    generation: int = 0
    """Bumped when the server is found unreachable or restarted: ids created before may be gone."""
    down_since: float | None = None
    """When the replica was found unreachable; None while it answers."""
    seconds_down: float = 0.0
    """Down time of earlier outages (the current one is counted from `down_since`)."""
    episodes: int = 0
    """Env ids ever opened on the replica."""
    errors: int = 0
    """Requests to the replica that failed (error replies, timeouts, lost connections)."""
    instance: str | None = None
    """The latest `X-AgentGym-Instance` seen (None: the server sends none)."""
    retired: set[str] = field(default_factory=set)
    """Instances seen before the current one (late replies from them are no news)."""
    held: set[tuple[int, int]] = field(default_factory=set)
    """(generation, env id) of every env id this client holds on the server."""
    max_id: int = -1
    """The largest env id handed to this client in the current generation."""
    restarts: int = 0


class ServerPool:
    """Connections to the replicas of one AgentGym server, shared by every env instance.

    Args:
        urls: base URL of each replica.
        timeout_s: the longest one request may take.
        connect_timeout_s: the longest opening a connection may take.
        max_concurrency: requests in flight per replica (extra callers wait their turn).
        retry_503: retries of a request answered 503 (busy).
    """

    def __init__(
        self,
        urls: list[str],
        *,
        timeout_s: float = 60.0,
        connect_timeout_s: float = 5.0,
        max_concurrency: int = 16,
        retry_503: int = 3,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.retry_503 = retry_503
        timeout = httpx.Timeout(timeout_s, connect=min(connect_timeout_s, timeout_s))
        limits = httpx.Limits(
            max_connections=max_concurrency,
            max_keepalive_connections=max_concurrency,
            keepalive_expiry=IDLE_REUSE_S,
        )
        self._servers = {
            url: _Server(
                url,
                httpx.Client(base_url=url, timeout=timeout, limits=limits),
                threading.BoundedSemaphore(max_concurrency),
            )
            for url in urls
        }
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self._prober: threading.Thread | None = None
        self._closed = threading.Event()

    @property
    def urls(self) -> list[str]:
        """Base URL of every replica."""
        return list(self._servers)

    # -- balancing ---------------------------------------------------------------------

    def pick(self) -> str:
        """The replica for a new env id: fewest open ids among those up (all, if none is)."""
        with self._lock:
            servers = list(self._servers.values())
            up = [s for s in servers if s.down_since is None] or servers
            fewest = min(s.open_ids for s in up)
            tied = [s for s in up if s.open_ids == fewest]
            return tied[next(self._turn) % len(tied)].url

    def crowded(self, url: str) -> bool:
        """`url` holds 2 or more open ids than the emptiest replica up: moving one evens them."""
        with self._lock:
            up = [s.open_ids for s in self._servers.values() if s.down_since is None]
            return bool(up) and self._servers[url].open_ids - min(up) >= 2

    def id_floor(self, url: str) -> tuple[int, int]:
        """(generation, largest env id seen in it): taken before a create is sent (`opened`)."""
        with self._lock:
            server = self._servers[url]
            return server.generation, server.max_id

    def opened(
        self,
        url: str,
        env_id: int | None = None,
        *,
        ids_only_grow: bool = False,
        floor: tuple[int, int] | None = None,
    ) -> int:
        """Count a new env id on `url`; returns the server's generation it belongs to.

        With `ids_only_grow` (servers that count ids up, as AgentGym's do), the
        server restarted when it hands out an id this client still holds, or an
        id no larger than the largest one seen before the create was sent
        (`floor`, from `id_floor`): every id from its previous life is then
        marked stale before anyone steps it. The second rule sees a restart at
        the new life's first id; without it, the ids made before a held one
        came back would be taken for the old life's and abandoned open.
        """
        with self._lock:
            server = self._servers[url]
            if ids_only_grow and env_id is not None and self._reused(server, env_id, floor):
                self._restarted(server, f"it handed out env id {env_id} again")
            server.open_ids += 1
            server.episodes += 1
            if env_id is not None:
                server.held.add((server.generation, env_id))
                server.max_id = max(server.max_id, env_id)
            return server.generation

    @staticmethod
    def _reused(server: _Server, env_id: int, floor: tuple[int, int] | None) -> bool:
        if (server.generation, env_id) in server.held:
            return True
        if floor is None:
            return False
        generation, largest = floor
        # a restart another create has already seen since this one was sent is not news
        return generation == server.generation and env_id <= largest

    def released(self, url: str, env_id: int | None = None, generation: int = 0) -> None:
        """An env id on `url` is closed or abandoned."""
        with self._lock:
            server = self._servers[url]
            server.open_ids = max(0, server.open_ids - 1)
            if env_id is not None:
                server.held.discard((generation, env_id))

    def restarts(self) -> dict[str, int]:
        """Restarts seen of each replica without a failed request (new instance, reused id)."""
        return {url: s.restarts for url, s in self._servers.items()}

    def generation(self, url: str) -> int:
        """How many times `url` was found unreachable."""
        return self._servers[url].generation

    def open_ids(self) -> dict[str, int]:
        """Env ids open on each replica (what balancing looks at)."""
        return {url: s.open_ids for url, s in self._servers.items()}

    def is_up(self, url: str) -> bool:
        """False from a failed connection until it answers again (a probe, or any request)."""
        return self._servers[url].down_since is None

    def counters(self) -> dict[str, float]:
        """Per replica (`host_port`): env ids opened, failed requests, seconds down, restarts."""
        now = time.monotonic()
        out: dict[str, float] = {}
        with self._lock:
            for url, s in self._servers.items():
                name = server_name(url)
                down = s.seconds_down + (now - s.down_since if s.down_since is not None else 0.0)
                out[f"server/{name}/episodes"] = float(s.episodes)
                out[f"server/{name}/env_errors"] = float(s.errors)
                out[f"server/{name}/seconds_down"] = round(down, 3)
                out[f"server/{name}/restarts"] = float(s.restarts)
        return out

    def _mark_down(self, server: _Server) -> None:
        """A request found `server` unreachable: probe it, and new ids avoid it meanwhile.

        A server that names its life in a header shows a restart in its next reply,
        so one dropped connection costs only the request that saw it. Without the
        header any outage may hide a restart: every id held there is marked stale.
        """
        with self._lock:
            if server.instance is None:
                server.generation += 1
                server.max_id = -1
            if server.down_since is None:
                server.down_since = time.monotonic()
                log.warning("env server %s is down; probing it until it answers", server.url)
            if self._prober is None or not self._prober.is_alive():
                self._prober = threading.Thread(
                    target=self._probe_while_down, name="agentgym-remote-probe", daemon=True
                )
                self._prober.start()

    def _probe_while_down(self) -> None:
        """Probe every replica that is down until each answers (or the pool closes)."""
        while not self._closed.wait(PROBE_EVERY_S):
            with self._lock:
                down = [s for s in self._servers.values() if s.down_since is not None]
                if not down:
                    self._prober = None
                    return
            for server in down:
                try:
                    response = server.client.get("/", timeout=PROBE_TIMEOUT_S)
                except httpx.HTTPError:
                    continue
                # a restart seen here marks the old life's ids stale before any episode sends one
                self._saw_instance(server, response.headers.get(INSTANCE_HEADER))
                self._answers(server)

    def _answers(self, server: _Server) -> None:
        """`server` answered (a probe or any request): it is up again, if it was down."""
        if server.down_since is None:
            return
        with self._lock:
            if server.down_since is not None:
                server.seconds_down += time.monotonic() - server.down_since
                server.down_since = None
                log.warning("env server %s answers again", server.url)

    def _restarted(self, server: _Server, why: str) -> None:
        """Count and log a restart seen in a reply; the caller holds the lock."""
        stale = sum(1 for generation, _ in server.held if generation == server.generation)
        server.generation += 1
        server.max_id = -1
        server.restarts += 1
        log.warning(
            "env server %s restarted (%s); %d env id(s) of its previous life are dropped, "
            "their episodes end as env_error",
            server.url,
            why,
            stale,
        )

    def _saw_instance(self, server: _Server, instance: str | None) -> None:
        """Note the instance a reply came from; a new one means the server restarted.

        A reply without the header tells nothing (AgentGym's servers, or a proxy's error page).
        """
        if instance is None or instance == server.instance or instance in server.retired:
            return
        with self._lock:
            if instance == server.instance or instance in server.retired:
                return
            if server.instance is not None:
                server.retired.add(server.instance)
                self._restarted(server, f"instance {server.instance} is now {instance}")
            server.instance = instance

    # -- requests ---------------------------------------------------------------------

    def request(
        self,
        url: str,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        instance: str | None = None,
    ) -> Any:
        """Send one request to replica `url` and return its JSON, or raise `RemoteEnvError`.

        `instance`: the server life the env id came from; sent along (`serve-env`
        refuses a request meant for another life), and a reply from another one
        raises `ServerRestarted`.
        """
        return self.exchange(
            url, method, path, json=json, params=params, timeout_s=timeout_s, instance=instance
        )[0]

    def exchange(
        self,
        url: str,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        instance: str | None = None,
    ) -> tuple[Any, str | None]:
        """`request`, also returning the instance that answered (None: no header)."""
        server = self._servers[url]
        where = f"{method} {url}{path}"
        if not server.slots.acquire(timeout=self.timeout_s):
            raise RemoteEnvError(
                f"{where}: no free request slot within {self.timeout_s} s "
                f"({self.max_concurrency} requests already in flight)"
            )
        headers = {INSTANCE_HEADER: instance} if instance else None
        try:
            response = self._send(server, where, method, path, json, params, timeout_s, headers)
            answered = response.headers.get(INSTANCE_HEADER)
            self._saw_instance(server, answered)
            self._answers(server)
            if instance is not None and answered is not None and answered != instance:
                raise ServerRestarted(
                    f"{where}: the server restarted (instance {instance} is now {answered}); "
                    "the env id is gone and the episode is lost"
                )
            return _reply(where, response), answered
        except RemoteEnvError:
            with self._lock:
                server.errors += 1
            raise
        finally:
            server.slots.release()

    def _send(
        self,
        server: _Server,
        where: str,
        method: str,
        path: str,
        body: Any,
        params: dict[str, Any] | None,
        timeout_s: float | None,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        extra: dict[str, Any] = {} if timeout_s is None else {"timeout": timeout_s}
        if headers:
            extra["headers"] = headers
        if body is not None:
            extra["json"] = body
        for attempt in itertools.count():
            try:
                response = server.client.request(method, path, params=params, **extra)
            except httpx.TimeoutException as error:
                limit = timeout_s or self.timeout_s
                raise RemoteEnvError(f"{where}: no answer within {limit} s") from error
            except httpx.TransportError as error:
                self._mark_down(server)
                raise ServerUnreachable(
                    f"{where}: server unreachable ({type(error).__name__}: {error})"
                ) from error
            if response.status_code != 503 or attempt >= self.retry_503:
                return response
            time.sleep(0.2)
        raise AssertionError("unreachable")  # pragma: no cover

    def close(self) -> None:
        """Close every connection and stop probing."""
        self._closed.set()
        for server in self._servers.values():
            server.client.close()


def server_name(url: str) -> str:
    """`http://10.0.0.5:36001/` -> `10.0.0.5_36001`: a metric-name-safe replica name."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", url.split("://", 1)[-1].rstrip("/"))


def _reply(where: str, response: httpx.Response) -> Any:
    """The JSON of a reply, or a `RemoteEnvError` that says what went wrong."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if response.status_code >= 400:
        detail = data.get("detail", data) if isinstance(data, dict) else response.text
        kinds = (
            {d.get("type") for d in detail if isinstance(d, dict)}
            if isinstance(detail, list)
            else set()
        )
        error_class = SessionLost if "unknown_id" in kinds else RemoteEnvError
        raise error_class(f"{where}: HTTP {response.status_code}: {str(detail)[:500]}")
    if data is None and response.content.strip() != b"null":
        raise RemoteEnvError(f"{where}: reply is not JSON: {response.text[:200]!r}")
    if isinstance(data, dict) and "error" in data:
        message = str(data["error"])
        error_class = SessionLost if INVALID_ID.search(message) else RemoteEnvError
        raise error_class(f"{where}: server error: {message[:500]}")
    return data


_SHARED: dict[tuple[Any, ...], tuple[ServerPool, int]] = {}
_SHARED_LOCK = threading.Lock()


def acquire_pool(key: tuple[Any, ...], **options: Any) -> ServerPool:
    """The pool for `key` (made from `options` on first use); every env of a run shares it.

    Sharing is what bounds concurrency per server across env instances and
    lets balancing see every open env id. Pair with `release_pool`.
    """
    with _SHARED_LOCK:
        pool, users = _SHARED.get(key, (None, 0))
        if pool is None:
            pool = ServerPool(**options)
        _SHARED[key] = (pool, users + 1)
        return pool


def release_pool(key: tuple[Any, ...]) -> None:
    """One user less of the pool for `key`; the last one closes its connections."""
    with _SHARED_LOCK:
        pool, users = _SHARED[key]
        if users > 1:
            _SHARED[key] = (pool, users - 1)
            return
        del _SHARED[key]
    pool.close()
