"""Find a run's MLflow store and build the `mlflow ui` command line that opens it.

Kept free of MLflow imports so `agentgym ui` starts fast; the command runs
MLflow through the current interpreter (`python -m mlflow`), so it works
whether or not the `mlflow` script is on PATH.
"""

from __future__ import annotations

import sys
from pathlib import Path

from agentgym_core.tracking.mlflow_tracker import ARTIFACTS_DIR, STORE_FILE, sqlite_uri

_SEARCH_DEPTH = 2


def find_store(path: str | Path) -> Path:
    """The SQLite store that holds the runs of `path`.

    Looks, in order, at `path` itself (a `.db` file), `path/mlflow.db`, then up
    the parents (a stage folder inside a run, a run inside a shared `runs/`
    store), then down at most two levels (`runs/` holding one store per run:
    the most recently written wins).

    Raises:
        FileNotFoundError: no store anywhere there.
    """
    path = Path(path).expanduser().resolve()
    if path.is_file():
        return path
    for folder in (path, *path.parents):
        if (folder / STORE_FILE).is_file():
            return folder / STORE_FILE
    below = [
        p
        for depth in range(1, _SEARCH_DEPTH + 1)
        for p in path.glob("/".join(["*"] * depth + [STORE_FILE]))
    ]
    if below:
        return max(below, key=lambda p: p.stat().st_mtime)
    raise FileNotFoundError(
        f"no MLflow store ({STORE_FILE}) in {path}, its parents, or its sub-folders; "
        "has a run been tracked there?"
    )


def ui_command(run_dir_or_uri: str | Path, port: int = 5000, host: str = "127.0.0.1") -> list[str]:
    """The `mlflow ui` command for a run folder, a store file, or a database URI.

    `http(s)://` URIs are servers with their own UI: open them in a browser.

    Raises:
        ValueError: `run_dir_or_uri` is a tracking server URI.
        FileNotFoundError: no store found (see `find_store`).
    """
    target = str(run_dir_or_uri)
    if target.startswith(("http://", "https://")):
        raise ValueError(f"{target} is a tracking server: open it in a browser")
    if "://" in target:
        backend = target
        artifacts = None
        if target.startswith("sqlite:///"):
            artifacts = Path(target.removeprefix("sqlite:///")).parent / ARTIFACTS_DIR
    else:
        store = find_store(target)
        backend = sqlite_uri(store)
        artifacts = store.parent / ARTIFACTS_DIR
    command = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", backend]
    if artifacts is not None:
        command += ["--default-artifact-root", artifacts.resolve().as_uri()]
    return command + ["--host", host, "--port", str(port)]
