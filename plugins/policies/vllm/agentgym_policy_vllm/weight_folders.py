"""The weights folders the `vllm_server` policy writes for its replicas, and their marks.

Each sync's folder is `agentgym-v<6-digit number>[-<digest>]` under
`policy.weights_dir`; rank 0 writes `<folder>.synced` beside it once the
replicas reloaded it (the other ranks poll for it).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PREFIX = "agentgym-v"
"""Start of the names of the weights folders (and marks) in `weights_dir`."""
SYNCED = ".synced"
"""Suffix of the file rank 0 writes beside a weights folder once every replica reloaded it."""


@dataclass(frozen=True)
class StagedWeights:
    """Weights written for the replicas (`stage_weights`), not yet loaded by them."""

    folder: Path
    expected: list[float]
    """The learner's log-probabilities of the probe on these weights."""
    seconds: float
    """Time spent writing them (counted in `sync_seconds`)."""


def version_of(name: str | Path) -> int:
    """The sync number in a weights folder's name (`agentgym-v000012-<digest>`); else -1."""
    digits = Path(name).name[len(PREFIX) :][:6]
    return int(digits) if digits.isdigit() else -1


def remove_all_but(weights_dir: Path, keep: Iterable[str]) -> None:
    """Delete every folder and mark of ours in `weights_dir` but those named by `keep`.

    A kept name keeps everything it begins: its `.synced` mark, and its `.tmp`
    while `save_weights` writes it.
    """
    kept = tuple(keep)
    for old in weights_dir.glob(f"{PREFIX}*"):
        if old.name.startswith(kept):
            continue
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def write_atomically(path: Path, text: str) -> None:
    """`path` appears with all of `text` or not at all (other ranks poll for it)."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    partial.replace(path)
