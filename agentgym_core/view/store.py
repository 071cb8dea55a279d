"""Read a run folder: its MLflow store (stages, metrics) and where its episodes are.

The store is opened as a read-only SQLite file (`mode=ro`), not through
`MlflowClient`: the viewer only reads four tables, starts in milliseconds
instead of seconds, and can never write to the run. Each MLflow run of the
store is one stage of the pipeline (`<run.name>/<stage>`).

Every path the viewer touches goes through `Run.inside`, which refuses
anything that resolves outside the run folder (`..`, absolute paths, links).
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from agentgym_core.tracking.mlflow_tracker import RUN_ID_FILE
from agentgym_core.tracking.ui import find_store

ROLLOUTS = "rollouts"
"""A stage folder's saved trajectories (`tracking.save_rollouts`); same name as run/offline.py."""

CURVES = {
    "success": "rollout/success_rate",
    "reward": "rollout/reward_mean",
    "horizon": "rollout/horizon",
    "turns": "rollout/turns_mean",
    "entropy": "train/entropy",
}
"""The overview's curves: title -> metric key of a train stage."""


class OutsideRun(ValueError):
    """A path that resolves outside the run folder."""


@dataclass
class Stage:
    """One MLflow run of the store: a stage of the pipeline."""

    run_id: str
    name: str
    run_name: str
    status: str
    start_ms: int
    end_ms: int | None
    artifact_uri: str
    kind: str = "eval"
    """`train` when the run logged rollout metrics, else `eval`."""
    folder: Path | None = None
    """The stage's output folder (holds `mlflow_run_id`), when found in the run."""
    final: dict[str, float] = field(default_factory=dict)
    """Last value of every metric."""


class Run:
    """A run folder and its MLflow store, read-only.

    Args:
        path: the run folder (or a stage folder, or the store file) as for `agentgym ui`.

    Raises:
        FileNotFoundError: no MLflow store there (see `find_store`).
    """

    def __init__(self, path: str | Path) -> None:
        self.store = find_store(path)
        self.root = self.store.parent.resolve()

    @property
    def name(self) -> str:
        """The run's `run.name` (its MLflow run names' part before `/`), else the folder name."""
        with self.connect() as db:
            row = db.execute("SELECT name FROM runs ORDER BY start_time LIMIT 1").fetchone()
        if row and row[0] and "/" in row[0]:
            return row[0].rsplit("/", 1)[0]
        return self.root.name

    def connect(self) -> sqlite3.Connection:
        """A read-only connection to the store (a new one per caller: threads)."""
        uri = f"{self.store.resolve().as_uri()}?mode=ro"
        return sqlite3.connect(uri, uri=True, check_same_thread=False)

    def fingerprint(self) -> str:
        """Changes when the run logs anything: metric rows, run states, end times.

        From the store's content, not its files' times: readers may checkpoint
        SQLite's write-ahead log, which touches the files without a change.
        """
        with self.connect() as db:
            metrics = db.execute("SELECT COUNT(*) FROM metrics").fetchone()[0]
            runs = db.execute(
                "SELECT COUNT(*), GROUP_CONCAT(status), MAX(end_time) FROM runs"
            ).fetchone()
        return f"{metrics}-{runs[0]}-{runs[1]}-{runs[2]}"

    def inside(self, relative: str | Path) -> Path:
        """`relative` resolved under the run folder.

        Raises:
            OutsideRun: it resolves outside (`..`, an absolute path, a link out).
        """
        path = (self.root / relative).resolve()
        if path != self.root and self.root not in path.parents:
            raise OutsideRun(f"{relative} is outside the run {self.root}")
        return path

    def stages(self) -> list[Stage]:
        """Every MLflow run of the store, oldest first, with kind, folder and last metrics."""
        with self.connect() as db:
            rows = db.execute(
                "SELECT run_uuid, name, status, start_time, end_time, artifact_uri "
                "FROM runs WHERE lifecycle_stage = 'active' ORDER BY start_time"
            ).fetchall()
            latest = db.execute("SELECT run_uuid, key, value FROM latest_metrics").fetchall()
        folders = self._stage_folders()
        stages = []
        for run_id, run_name, status, start, end, artifact_uri in rows:
            name = (run_name or run_id).rsplit("/", 1)[-1]
            stage = Stage(run_id, name, run_name or run_id, status, start or 0, end, artifact_uri)
            stage.folder = folders.get(run_id)
            stages.append(stage)
        by_id = {s.run_id: s for s in stages}
        for run_id, key, value in latest:
            if run_id in by_id:
                by_id[run_id].final[key] = value
        for stage in stages:
            if any(k.startswith(("rollout/", "train/")) for k in stage.final):
                stage.kind = "train"
        return stages

    def _stage_folders(self) -> dict[str, Path]:
        """MLflow run id -> the stage folder whose `mlflow_run_id` names it."""
        out = {}
        for marker in [self.root / RUN_ID_FILE, *self.root.glob(f"*/{RUN_ID_FILE}")]:
            if marker.is_file():
                out.setdefault(marker.read_text().strip(), marker.parent)
        return out

    def artifacts(self, stage: Stage) -> Path | None:
        """The stage's MLflow artifact folder when it lies inside the run, else None."""
        parsed = urlparse(stage.artifact_uri or "")
        if parsed.scheme not in ("file", ""):
            return None
        try:
            return self.inside(unquote(parsed.path))
        except OutsideRun:
            return None

    def metric_series(self, run_id: str, keys: list[str]) -> dict[str, list[tuple[int, float]]]:
        """`key -> [(step, value), ...]` in step order (the last value logged at a step wins)."""
        if not keys:
            return {}
        marks = ",".join("?" * len(keys))
        with self.connect() as db:
            rows = db.execute(
                f"SELECT key, step, value FROM metrics WHERE run_uuid = ? AND key IN ({marks}) "
                "ORDER BY key, step, timestamp",
                [run_id, *keys],
            ).fetchall()
        out: dict[str, dict[int, float]] = {}
        for key, step, value in rows:
            out.setdefault(key, {})[step] = value
        return {key: sorted(points.items()) for key, points in out.items()}

    def param(self, run_id: str, key: str) -> object:
        """A logged param, JSON-decoded where it is JSON (None when absent)."""
        with self.connect() as db:
            row = db.execute(
                "SELECT value FROM params WHERE run_uuid = ? AND key = ?", (run_id, key)
            ).fetchone()
        if row is None:
            return None
        try:
            return json.loads(row[0])
        except ValueError:
            return row[0]


def horizon_changes(series: list[tuple[int, float]]) -> list[tuple[int, int]]:
    """`(step, new horizon)` wherever the rollout horizon changes: ScalingInter stage starts."""
    out = []
    for (_, before), (step, after) in zip(series, series[1:], strict=False):
        if after != before:
            out.append((step, int(after)))
    return out
