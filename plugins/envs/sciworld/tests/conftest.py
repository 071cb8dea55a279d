"""Fixtures of the sciworld tests: Java must be installed, and no JVM may outlive its test."""

from __future__ import annotations

import shutil
from collections.abc import Callable

import psutil
import pytest


@pytest.fixture(scope="session")
def java() -> None:
    """Fail (not skip) when Java is missing: scripts/ensure_java.sh installs it."""
    if shutil.which("java") is None:
        pytest.fail(
            "ScienceWorld needs `java` on PATH: run plugins/envs/sciworld/scripts/ensure_java.sh",
            pytrace=False,
        )


def _java_descendants() -> list[psutil.Process]:
    """JVMs started (through workers) by this test process; one exiting while listed is skipped."""
    found = []
    for process in psutil.Process().children(recursive=True):
        try:
            if "java" in process.name():
                found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture
def java_descendants() -> Callable[[], list[psutil.Process]]:
    return _java_descendants
