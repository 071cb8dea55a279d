"""The replicas' HTTP for the `vllm_server` policy (`server.py`).

One POST that sorts failures into down, refused and wrong, and the checks a
replica passes before the policy uses it: its served model, its tokenizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentgym_core.api import ConfigError, Problem
from agentgym_policy_vllm.weights import PROBE


class ServerPolicyError(RuntimeError):
    """A replica answered wrongly or not at all; the message names it."""


class ReplicaDown(ServerPolicyError):
    """A replica could not be reached (refused, reset, timed out)."""


class ReplicaError(ReplicaDown):
    """A replica answered with a server error (HTTP 5xx): its turns go to another, as if down."""


def post(http: Any, url: str, path: str, body: dict[str, Any] | None) -> Any:
    """POST `body` to a replica; the reply's JSON (None when empty).

    Unreachable: `ReplicaDown`; HTTP 5xx: `ReplicaError` (both move the turn to another
    replica); another 4xx: `ServerPolicyError` (the request itself is wrong).
    """
    import httpx

    try:
        response = http.post(f"{url}{path}", json=body)
    except httpx.TransportError as error:
        raise ReplicaDown(f"POST {url}{path}: {type(error).__name__}: {error}") from None
    if response.status_code >= 500:
        raise ReplicaError(f"POST {url}{path}: HTTP {response.status_code}: {response.text[:500]}")
    if response.status_code >= 400:
        raise ServerPolicyError(
            f"POST {url}{path}: HTTP {response.status_code}: {response.text[:500]}"
        )
    return response.json() if response.content else None


def served_model(http: Any, url: str, configured: str | None) -> str:
    """The model name `url` serves (`/v1/models`); a `configured` name must be among them.

    Unreachable or HTTP 5xx: `ReplicaDown` (it may be starting); a wrong name or reply:
    `ConfigError`.
    """
    import httpx

    try:
        response = http.get(f"{url}/v1/models")
    except httpx.TransportError as error:
        raise ReplicaDown(f"GET {url}/v1/models: {type(error).__name__}: {error}") from None
    if response.status_code >= 500:
        raise ReplicaError(f"GET {url}/v1/models: HTTP {response.status_code}")
    try:
        listed = response.raise_for_status().json()["data"]
    except (httpx.HTTPError, KeyError, ValueError) as error:
        raise ConfigError(
            [Problem("policy.base_urls", f"{url} does not answer /v1/models: {error}")]
        ) from None
    names = [entry["id"] for entry in listed]
    if configured is None:
        return names[0]
    if configured not in names:
        raise ConfigError([Problem("policy.model", f"{url} serves {names}, not {configured!r}")])
    return configured


def answering_models(
    http: Any, urls: Sequence[str], configured: str | None
) -> tuple[dict[str, str], dict[str, ReplicaDown]]:
    """(url -> served model) of the replicas that answer, and why each other one did not.

    A policy starts on the replicas that answer; the others are used once they
    do. None answering is a `ConfigError` naming each.
    """
    served, down = {}, {}
    for url in urls:
        try:
            served[url] = served_model(http, url, configured)
        except ReplicaDown as error:
            down[url] = error
    if not served:
        reasons = "; ".join(str(error) for error in down.values())
        raise ConfigError([Problem("policy.base_urls", f"no replica answers: {reasons}")])
    return served, down


def check_same_tokenizer(
    http: Any, served: dict[str, str], model: Any, tokenizer: Any, urls: Sequence[str]
) -> None:
    """Refuse a replica that tokenizes a probe text otherwise: it serves another model.

    Checked before the first sync, whose reload would break a replica of
    another architecture. Skipped where a replica has no `/tokenize`.
    """
    text = " ".join(PROBE)
    ours = list(tokenizer.encode(text, add_special_tokens=False))
    learner = getattr(model, "name_or_path", "") or type(model).__name__
    for url in urls:
        body = {"model": served[url], "prompt": text, "add_special_tokens": False}
        try:
            theirs = post(http, url, "/tokenize", body)["tokens"]
        except (ServerPolicyError, KeyError, TypeError):
            continue
        if theirs != ours:
            raise ConfigError(
                [
                    Problem(
                        "policy.base_urls",
                        f"{url} serves {served[url]!r}, which is not the learner's model "
                        f"{learner!r}: it tokenizes {text!r} as {theirs}, the learner as "
                        f"{ours}. Start the server with the model.path of this run.",
                    )
                ]
            )
