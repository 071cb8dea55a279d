"""Saved rollouts: every trajectory of a stage as JSONL, and reading them back.

With `tracking.save_rollouts`, each update's rollouts (and an eval stage's
episodes) are written under `<run.output_dir>/rollouts/`; DPO's `pairs_from`
and SFT's `rollouts_from` read them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentgym_core import hookimpl
from agentgym_core.data.trajfiles import read_jsonl
from agentgym_core.plugins import PluginHost
from agentgym_core.types import Trajectory

ROLLOUTS = "rollouts"
"""Sub-folder of a stage's output dir holding its saved trajectories."""

# -- saved rollouts ----------------------------------------------------------------------


def save_rollouts(path: Path, trajectories: Iterable[Trajectory]) -> Path:
    """Write trajectories as JSONL (`Trajectory.to_dict` per line), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for trajectory in trajectories:
            out.write(json.dumps(trajectory.to_dict(), ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


def read_rollouts(folder: Path) -> list[Trajectory]:
    """Every trajectory saved under `folder` (files in name order)."""
    return [t for path in sorted(folder.glob("*.jsonl")) for t in read_jsonl(path)]


class RolloutRecorder:
    """Saves every trajectory of a stage: `step-000012.jsonl` per update, `eval-<split>.jsonl`."""

    def __init__(self, output_dir: Path) -> None:
        self.folder = Path(output_dir) / ROLLOUTS

    @hookimpl
    def agentgym_after_rollout(self, step: int, batch: Any, metrics: Mapping[str, float]) -> None:
        """Write the rollouts of update `step` (a resumed step overwrites its file)."""
        save_rollouts(self.folder / f"step-{step:06d}.jsonl", batch.trajectories)

    def save_evaluation(self, split: str, trajectories: Sequence[Trajectory]) -> Path:
        """Write an evaluation's episodes."""
        return save_rollouts(self.folder / f"eval-{split}.jsonl", trajectories)


def start_recording(resolved: Any, host: PluginHost) -> RolloutRecorder | None:
    """Register a recorder for this stage when `tracking.save_rollouts` is on."""
    if not resolved.root.tracking.save_rollouts:
        return None
    recorder = RolloutRecorder(Path(resolved.root.run.output_dir))
    host.pm.register(recorder, name=f"rollouts-{id(recorder)}")
    return recorder


def stop_recording(host: PluginHost, recorder: RolloutRecorder | None) -> None:
    """Unregister a recorder made by `start_recording` (None: nothing to do)."""
    if recorder is not None:
        host.pm.unregister(recorder)
