"""The `vllm_server` policy: generation on stock `vllm serve` replicas, token in and token out.

The learner's process sends each turn's prompt token ids to one replica's
`/v1/completions` (`return_token_ids`) and gets back the sampled token ids and
their log-probabilities, so nothing is re-tokenized. All turns of an episode
go to the replica that served its first turn (its prefix cache holds the
episode); a new episode goes to the replica with the fewest requests in
flight. Constrained action decoding is the in-process policy's: the allowed
token sequences travel in `vllm_xargs` to `ActionTrieProcessor`, loaded by
the server (`--logits-processors`), which also reports log-probabilities after
the mask and temperature (`--logprobs-mode processed_logprobs`), the values the
learner recomputes. Every other sampling parameter is pinned off in each
request, and replicas run with `--generation-config vllm`, so neither fills in
a checkpoint's `generation_config.json` defaults. `agentgym serve-policy`
starts replicas with these flags.

Weights: when the policy is built and after each update, `sync_weights`
writes the learner's weights to a new folder under `weights_dir` (LoRA merged
in; a tied output layer written out, since vLLM's in-place reload keeps the
old one otherwise) and has every replica reload them in place: `/pause`
(which also drops the prefix cache), `/collective_rpc reload_weights
{weights_path}` (the server needs `VLLM_SERVER_DEV_MODE=1`), `/resume`. Each
replica then scores a probe, which must match the learner's log-probabilities
(`weights.py`). So a resumed run plays its checkpoint's weights, whatever the
replicas were started from. This is the path vLLM's CPU build supports; on
GPUs, NCCL weight transfer is the faster one (docs/scaling.md). With several
learner ranks (all holding the same weights) only rank 0 writes, reloads and
probes; the others wait for its `.synced` mark in the shared `weights_dir`, so
a replica reloads once per sync, not once per rank. The mark lists the
replicas reloaded: one rank 0 skipped is down on every rank until reloaded.

Faults: a replica that cannot be reached or answers a 5xx is marked down and
its turns move to another (the request carries the whole episode); it is used
again once `/health` answers and it has reloaded the current weights. A
replica silent for a few seconds is asked whether it restarted
(`restarts.py`), and if so reloads before it samples.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

from agentgym_core.api import (
    IDLE_REUSE_S,
    ActionConstraint,
    ChatFormat,
    ConfigError,
    Generation,
    Problem,
    SamplingParams,
    fingerprint,
)
from agentgym_policy_vllm.actions import NEUTRAL_SAMPLING, ActionTurns
from agentgym_policy_vllm.config import VLLMServerPolicyConfig, probe_tolerance
from agentgym_policy_vllm.replica_http import (
    ReplicaDown,
    ReplicaError,
    ServerPolicyError,
    answering_models,
    check_same_tokenizer,
    post,
    served_model,
)
from agentgym_policy_vllm.restarts import Restarts
from agentgym_policy_vllm.weight_folders import (
    PREFIX,
    SYNCED,
    StagedWeights,
    remove_all_but,
    version_of,
    write_atomically,
)
from agentgym_policy_vllm.weights import (
    check_probe,
    learner_dtype,
    learner_logprobs,
    probe_ids,
    save_weights,
)
from agentgym_policy_vllm.xargs import EXTRA_ARG, encode_sequences

log = logging.getLogger(__name__)


class VLLMServerPolicy:
    """Token-in-token-out generation on `vllm serve` replicas, synced after each update."""

    def __init__(self, config: VLLMServerPolicyConfig, *, model: Any, tokenizer: Any) -> None:
        import httpx

        self.rank = int(os.environ.get("RANK", "0"))
        self.ranks = int(os.environ.get("WORLD_SIZE", "1"))
        if self.ranks > 1 and not config.weights_dir:
            raise ConfigError(
                [
                    Problem(
                        "policy.weights_dir",
                        f"{self.ranks} learner ranks need a folder they and every replica share: "
                        "rank 0 writes the weights there, the other ranks wait for them",
                    )
                ]
            )
        self.config = config
        self.urls = [url.rstrip("/") for url in config.base_urls]
        self.chat = ChatFormat(tokenizer, getattr(model, "generation_config", None))
        self.http = httpx.Client(
            timeout=config.timeout_s,
            limits=httpx.Limits(
                max_connections=100, max_keepalive_connections=20, keepalive_expiry=IDLE_REUSE_S
            ),  # httpx's defaults, but for the expiry
        )
        self.served, down = answering_models(self.http, self.urls, config.model)
        self._lock = threading.Lock()
        self._sessions: dict[Hashable, str] = {}
        self._in_flight: collections.Counter[str] = collections.Counter()
        self._down: dict[str, float] = {}
        """Replica -> when it was found unreachable (until a health check answers)."""
        self.failovers = 0
        """Turns sent again to another replica because theirs stopped answering."""
        self.turns = ActionTurns(self.chat)
        self._tmp = None if config.weights_dir else tempfile.mkdtemp(prefix="agentgym-weights-")
        self.weights_dir = Path(config.weights_dir or self._tmp)
        self._version = 0
        self._synced: StagedWeights | None = None
        """The newest synced weights (None: the servers' own, as started)."""
        self._pending: set[str] = set()
        """Folders staged (`stage_weights`) for a later sync: cleanup keeps them (and their
        `.tmp` while written)."""
        self.sync_seconds: list[float] = []
        """Wall time of every weight sync (all replicas), the one at build first."""
        self.probe = probe_ids(self.chat)
        self.probe_tolerance = probe_tolerance(config.probe_tolerance, learner_dtype(model))
        self._expected: list[float] = []
        """The learner's log-probabilities of the probe at the newest sync."""
        self.probe_gaps: dict[str, list[float]] = collections.defaultdict(list)
        """Each replica's probe gap after every sync (rank 0)."""
        self.restarts = Restarts(self.http)
        for url, error in down.items():  # used once it answers, after a reload and its probe
            self._mark_down(url, error)
        self._check_tokenizer = functools.partial(
            check_same_tokenizer, self.http, self.served, model, tokenizer
        )
        self._check_tokenizer(list(self.served))
        try:
            self._first_sync(model)
        except BaseException:
            self.close()
            raise

    # -- generation --------------------------------------------------------------------

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        allowed_actions: Sequence[str] | None = None,
        *,
        session: Hashable | None = None,
    ) -> Generation:
        """Sample one turn on the episode's replica."""
        constraint = self.turns.constraint(allowed_actions)
        deadline = time.monotonic() + self.config.outage_s
        refused: set[str] = set()
        while True:
            url = await self._replica_up(session, deadline)
            body = self._request(list(prompt_ids), params, constraint, url)
            with self._lock:
                self._in_flight[url] += 1
            try:
                if self.restarts.due(url):
                    await asyncio.to_thread(self._check_restart, url)
                reply = await asyncio.to_thread(self._post, url, "/v1/completions", body)
                self.restarts.answered(url)
                return self._generation(url, reply["choices"][0], constraint)
            except ReplicaDown as error:
                # the request carries the whole episode: any replica can take the turn
                self._mark_down(url, error)
                if isinstance(error, ReplicaError):
                    refused.add(url)
                    if refused >= set(self.urls):  # the request, not the replicas
                        raise ServerPolicyError(
                            f"every replica answered this turn with a server error: {error}"
                        ) from None
            finally:
                with self._lock:
                    self._in_flight[url] -= 1

    def _check_restart(self, url: str) -> None:
        """A replica silent for a while may have restarted: if so, the current weights first."""
        import httpx

        with self.restarts.lock(url):
            if not self.restarts.due(url):
                return  # another turn just checked it
            try:
                restarted = self.restarts.restarted(url)
            except httpx.HTTPError as error:
                raise ReplicaDown(f"GET {url}/server_info: {type(error).__name__}") from None
            if restarted and self._synced is not None:
                log.warning("vLLM replica %s restarted: it gets the current weights", url)
                self._reload_checked(url, self._synced.folder)
                self.restarts.noticed += 1

    async def _replica_up(self, session: Hashable | None, deadline: float) -> str:
        """The session's replica, or the least busy one up; waits out an outage of all."""
        wait = 0.5
        while True:
            if self._down:
                await asyncio.to_thread(self._recheck_down)
            with self._lock:
                up = [u for u in self.urls if u not in self._down]
                held = self._sessions.get(session) if session is not None else None
                if held in up:
                    return held
                if up:
                    url = min(up, key=lambda u: (self._in_flight[u], self._held(u)))
                    if session is not None:
                        if held is not None:
                            self.failovers += 1
                        self._sessions[session] = url
                    return url
            if time.monotonic() >= deadline:
                raise ServerPolicyError(
                    f"no vLLM replica answered for policy.outage_s={self.config.outage_s:g} s "
                    f"({', '.join(self.urls)}); the update was not trained on"
                )
            await asyncio.sleep(wait)
            wait = min(wait * 2, 5.0)

    def _replica(self, session: Hashable | None) -> str:
        """The replica a session's next turn goes to (all replicas taken as up)."""
        with self._lock:
            if session is not None and session in self._sessions:
                return self._sessions[session]
            url = min(self.urls, key=lambda u: (self._in_flight[u], self._held(u)))
            if session is not None:
                self._sessions[session] = url
            return url

    def _mark_down(self, url: str, error: Exception) -> None:
        with self._lock:
            if url not in self._down:
                self._down[url] = time.monotonic()
                log.warning("vLLM replica %s is down (%s); its turns go elsewhere", url, error)

    def _recheck_down(self) -> None:
        """A down replica that answers /health (checked at most once a second) is up again."""
        import httpx

        now = time.monotonic()
        with self._lock:  # claim the due ones: other turns skip them for a second
            due = [url for url, since in self._down.items() if now - since >= 1.0]
            self._down.update(dict.fromkeys(due, now))
        for url in due:
            try:
                healthy = self.http.get(f"{url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                healthy = False
            if healthy and url not in self.served:  # down since the policy was built
                try:  # another model stops the run here (ConfigError), as at build
                    self.served[url] = served_model(self.http, url, self.config.model)
                    self._check_tokenizer([url])
                except ReplicaDown:
                    healthy = False
            if healthy and self._synced is not None:
                try:  # back, perhaps restarted from the first weights: give it the current ones
                    self._reload_checked(url, self._synced.folder)
                except ServerPolicyError:
                    healthy = False
            if healthy:
                with self._lock:
                    self._down.pop(url, None)
                log.warning("vLLM replica %s answers again", url)

    def _held(self, url: str) -> int:
        return sum(1 for held in self._sessions.values() if held == url)

    def _request(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        constraint: ActionConstraint | None,
        url: str,
    ) -> dict[str, Any]:
        max_tokens = params.max_new_tokens
        body: dict[str, Any] = {
            "model": self.served[url],
            "prompt": prompt_ids,
            "temperature": 0.0 if params.greedy else params.temperature,
            **NEUTRAL_SAMPLING,
            "logprobs": 0,
            "return_token_ids": True,
            "stop_token_ids": list(self.chat.stop_ids),
            "skip_special_tokens": False,
        }
        if not params.greedy and params.seed is not None:
            body["seed"] = params.seed
        if constraint is not None:
            max_tokens = max(max_tokens, *(len(s) for s in constraint.sequences))
            body["vllm_xargs"] = {EXTRA_ARG: encode_sequences(constraint.sequences)}
        body["max_tokens"] = max_tokens
        return body

    def _generation(
        self, url: str, choice: dict[str, Any], constraint: ActionConstraint | None
    ) -> Generation:
        stopped = choice.get("finish_reason") == "stop"
        logprobs = choice["logprobs"]["token_logprobs"]
        try:
            return self.turns.generation(
                choice["token_ids"], logprobs, constraint, stopped=stopped, sampler=url
            )
        except ValueError as error:  # the server applied no action mask
            raise ServerPolicyError(str(error)) from None

    # -- weights -----------------------------------------------------------------------

    def _first_sync(self, model: Any) -> None:
        """The sync at build: a replica that cannot take the learner's weights is misconfigured."""
        try:
            self.sync_weights(model)
        except ServerPolicyError as error:
            learner = getattr(model, "name_or_path", "") or type(model).__name__
            raise ConfigError(
                [
                    Problem(
                        "policy.base_urls",
                        f"a replica could not load the weights of the learner's model {learner!r} "
                        f"({error}). Start it with the model.path of this run (another "
                        "architecture cannot take them) and VLLM_SERVER_DEV_MODE=1 (the reload "
                        "endpoints); `agentgym serve-policy` does both.",
                    )
                ]
            ) from None

    def sync_weights(self, model: Any) -> None:
        """Write the learner's weights to a new folder; every replica reloads them and is probed.

        Rank 0 does both; another learner rank waits until rank 0 marks the same
        weights synced. With several ranks the folder is named by version and a
        digest of the weights, so a mark left by an earlier run cannot pass for
        this one's (one rank waits for nobody and skips the digest). Raises
        `WeightsMismatch` naming the replica whose probe is not the learner's.
        """
        self.sync_staged(self.stage_weights(model))

    def stage_weights(self, model: Any) -> StagedWeights:
        """Write `model`'s weights (rank 0) and note the probe they must score; nothing reloads.

        Rollouts ahead of the learner stage each version when it is pushed and
        sync it when a rollout starts on it, so no copy of the model is kept.
        """
        start = time.perf_counter()
        self._version += 1
        name = f"{PREFIX}{self._version:06d}"
        if self.ranks > 1:
            name += "-" + hashlib.sha1(repr(fingerprint(model)).encode()).hexdigest()[:12]
        folder = self.weights_dir / name
        expected = learner_logprobs(model, self.probe)  # on every rank: FSDP's is collective
        if self.rank == 0:
            with self._lock:  # before the write: a sync's cleanup on another thread keeps it
                self._pending.add(folder.name)
            save_weights(model, folder)
        return StagedWeights(folder, expected, time.perf_counter() - start)

    def synced_weights(self) -> StagedWeights | None:
        """The staged weights the replicas hold now (the build's sync, then the newest).

        Rollouts ahead of the learner start on these instead of staging the same
        weights again: a second write and reload of the whole model at every start.
        """
        return self._synced

    def sync_staged(self, staged: StagedWeights) -> None:
        """Every replica that answers reloads `staged` and is probed; older folders go.

        Weights the replicas already hold are not reloaded: rollouts on one version
        each sync it, and an evaluation syncs the newest again. (A replica that
        restarts since is reloaded at its next turn, not here.)
        """
        if self._synced is not None and staged.folder == self._synced.folder:
            return
        start = time.perf_counter()
        folder = staged.folder
        synced = folder.with_name(folder.name + SYNCED)
        self._expected = staged.expected
        if self.rank == 0:
            reloaded = []
            for url in self.urls:
                if url in self._down:
                    continue  # it gets these weights when it answers again
                try:
                    self._reload_checked(url, folder)
                    reloaded.append(url)
                except ReplicaDown as error:
                    self._mark_down(url, error)
            write_atomically(synced, json.dumps(reloaded))  # the other ranks read which
            self._clean_up(folder)
        else:
            self._await(synced)
            self._skip_unsynced(json.loads(synced.read_text()))
        self._synced = staged
        self.sync_seconds.append(staged.seconds + time.perf_counter() - start)

    def _clean_up(self, current: Path) -> None:
        """Delete every weights folder and mark but `current`'s and those staged after it.

        Rollouts sync in the order they were staged, so one staged before `current`
        will never be loaded; an earlier run's leftovers go too.
        """
        with self._lock:
            self._pending = {n for n in self._pending if version_of(n) > version_of(current)}
            keep = (current.name, *self._pending)
        remove_all_but(self.weights_dir, keep)

    def _await(self, synced: Path) -> None:
        """Block until rank 0 marks these weights synced on every replica that answers."""
        limit = self.config.timeout_s * (2 + len(self.urls))
        deadline = time.monotonic() + limit
        while not synced.exists():
            if time.monotonic() > deadline:
                raise ServerPolicyError(
                    f"rank {self.rank}: rank 0 did not sync these weights in {limit:g} s "
                    f"(no {synced.name} in policy.weights_dir={self.weights_dir})"
                )
            time.sleep(0.05)

    def _skip_unsynced(self, reloaded: list[str]) -> None:
        """Another rank's view of rank 0's sync: a replica it did not reload is down here too.

        So no rank generates on old weights; each reloads such a replica itself
        (and probes it) when it answers again (`_recheck_down`).
        """
        for url in self.urls:
            if url not in reloaded:
                with self._lock:
                    self._down[url] = time.monotonic() - 1.0  # rechecked at its next turn
                log.warning("vLLM replica %s missed rank 0's weight sync: down here too", url)

    def _reload(self, url: str, folder: Path) -> None:
        """`url` reloads the weights in `folder` in place; its prefix cache is dropped."""
        self._post(url, "/pause?mode=wait", None)
        try:
            body = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
            self._post(url, "/collective_rpc", body)
            self._post(url, "/reset_prefix_cache", None)
        finally:
            self._post(url, "/resume", None)

    def _reload_checked(self, url: str, folder: Path) -> None:
        """`_reload`, then the probe: `url` must now score it as the learner does."""
        import httpx

        self._reload(url, folder)
        served = self.served_logprobs(url, self.probe)
        gap = check_probe(f"vLLM replica {url}", served, self._expected, self.probe_tolerance)
        self.probe_gaps[url].append(gap)
        try:
            self.restarts.record(url)  # the process that now holds these weights
        except httpx.HTTPError as error:
            raise ReplicaDown(f"GET {url}/server_info: {type(error).__name__}") from None

    def served_logprobs(self, url: str, ids: Sequence[int]) -> list[float]:
        """`url`'s log-probability of each token of `ids` after the first (no sampling)."""
        body = {"model": self.served[url], "prompt": list(ids), "max_tokens": 1}
        body |= {"prompt_logprobs": 0, "temperature": 0.0}
        rows = self._post(url, "/v1/completions", body)["choices"][0]["prompt_logprobs"][1:]
        return [float(row[str(t)]["logprob"]) for row, t in zip(rows, ids[1:], strict=True)]

    def counters(self) -> dict[str, float]:
        """For the run's metrics (`policy/...`): failovers, replicas down, restarts, probe gap."""
        with self._lock:
            latest = [gaps[-1] for gaps in self.probe_gaps.values() if gaps]
            return {
                "failovers": float(self.failovers),
                "replicas_down": float(len(self._down)),
                "restarts": float(self.restarts.noticed),
                # the newest probe of each replica: its gap to the learner's log-probs
                "probe_gap_max": max(latest, default=0.0),
            }

    def release(self, session: Hashable) -> None:
        """The episode is over: its next turns will not come, forget its replica."""
        with self._lock:
            self._sessions.pop(session, None)

    def _post(self, url: str, path: str, body: dict[str, Any] | None) -> Any:
        return post(self.http, url, path, body)

    def close(self) -> None:
        """Close the connections; delete the weights no sync will load, and a temporary folder."""
        self.http.close()
        if self.rank == 0:
            for name in self._pending:
                shutil.rmtree(self.weights_dir / name, ignore_errors=True)
            self._pending.clear()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
