"""Fuzz the env server from its own OpenAPI schema (schemathesis): no 5xx, no hang.

Both of schemathesis' modes run: bodies that fit the schema, and bodies that
break it (wrong types, missing fields), which must get a 4xx naming the field.

Generated bodies name random ids, which would only ever test the 404 path,
so half of the cases that carry an `id` get a live session's id instead:
fuzzed `data_idx` and `action` values then reach a real BabyAI env.
"""

from __future__ import annotations

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("agentgym_env_babyai")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis.errors import Unsatisfiable  # noqa: E402

from agentgym_core.plugins import PluginHost  # noqa: E402
from agentgym_core.serve import ServerThread, build_app  # noqa: E402

LIVE: list[int] = []


@pytest.fixture(scope="module")
def served_schema():
    app = build_app(PluginHost().registry, "babyai", {"levels": ["GoToObj", "OpenDoor"]})
    with ServerThread(app) as server:
        with httpx.Client(base_url=server.url) as http:
            LIVE[:] = [http.post("/create").json()["id"] for _ in range(2)]
            http.post("/reset", json={"id": LIVE[0], "data_idx": 0})  # one reset, one fresh
        yield schemathesis.openapi.from_url(f"{server.url}/openapi.json")


def _fuzz(case) -> None:
    body = case.body
    if case.path != "/close" and isinstance(body, dict) and isinstance(body.get("id"), int):
        salt = body.get("data_idx", len(str(body.get("action", ""))))
        if isinstance(salt, int) and salt % 2 == 0:
            body["id"] = LIVE[salt % 4 // 2]
    query = case.query
    if isinstance(query, dict) and isinstance(query.get("id"), int) and query["id"] % 2 == 0:
        query["id"] = LIVE[0]
    response = case.call(timeout=10)
    assert response.status_code < 500, f"{case.method} {case.path} {body!r}: {response.text}"
    if response.status_code >= 400 and response.status_code != 405:
        assert response.json()["detail"], "an error body says what was wrong"


def test_no_5xx_and_no_hang(served_schema):
    operations = [result.ok() for result in served_schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/create", "/reset", "/step", "/close"}
    for operation in operations:
        for mode in schemathesis.GenerationMode:  # valid bodies, then bodies that break the schema
            fuzz = settings(
                max_examples=25,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                derandomize=True,
                database=None,
            )(given(case=operation.as_strategy(mode))(_fuzz))
            try:
                fuzz()
            except Unsatisfiable:  # nothing to break: a route without parameters or body
                assert mode == schemathesis.GenerationMode.NEGATIVE, operation.path
