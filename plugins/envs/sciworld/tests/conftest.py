"""Fixtures of the sciworld tests: Java must be installed."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="session")
def java() -> None:
    """Fail (not skip) when Java is missing: scripts/ensure_java.sh installs it."""
    if shutil.which("java") is None:
        pytest.fail(
            "ScienceWorld needs `java` on PATH: run plugins/envs/sciworld/scripts/ensure_java.sh",
            pytrace=False,
        )
