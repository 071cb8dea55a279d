"""Track a run in MLflow: config as params, per-step metrics, trajectories.

`MlflowTracker` is a plugin object: register it with the `PluginHost` and
the lifecycle hooks feed it. It talks to MLflow only through an
`MlflowClient` bound to its own store and run id, never through the fluent
`mlflow.start_run` state, so several trackers can live in one process.

Default store: `sqlite:///<run_dir>/mlflow.db`, artifacts in
`<run_dir>/mlartifacts`, nothing to start; `agentgym ui` opens it.
"""

from __future__ import annotations

import json
import logging
import re
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentgym_core import hookimpl
from agentgym_core.evaluation.metrics import measured
from agentgym_core.types import Trajectory, TrajectoryBatch, round_robin

STORE_FILE = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"
RUN_ID_FILE = "mlflow_run_id"
MAX_PARAM_CHARS = 6000  # mlflow.utils.validation.MAX_PARAM_VAL_LENGTH
MAX_KEY_CHARS = 250
_PARAMS_PER_BATCH = 100
_METRICS_PER_BATCH = 1000
TOKEN_FIELDS = ("token_ids", "loss_mask", "logprobs", "constraints", "advantages", "returns")
"""Dropped from JSONL lines: long, unreadable, and already in the learner's hands."""

_log = logging.getLogger(__name__)


def quiet_mlflow() -> None:
    """Silence the INFO chatter of store creation (alembic migrations) and import warnings."""
    for name in ("alembic", "alembic.runtime.migration", "mlflow.store.db.utils"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for category in (FutureWarning, DeprecationWarning):  # mlflow's own, not actionable here
        warnings.filterwarnings("ignore", category=category, module=r"mlflow(\.|$)")


def sqlite_uri(db: Path) -> str:
    """The SQLAlchemy URI of a SQLite file (absolute, so the CWD does not matter)."""
    return f"sqlite:///{Path(db).resolve()}"


def artifact_root(uri: str) -> str | None:
    """Where a SQLite store keeps artifacts (`mlartifacts` beside the file); None for servers."""
    if not uri.startswith("sqlite:///"):
        return None
    return (Path(uri.removeprefix("sqlite:///")).parent / ARTIFACTS_DIR).resolve().as_uri()


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config as `a.b.c` keys and string values (lists JSON-encoded), truncated."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
            continue
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        out[metric_key(name)] = text[:MAX_PARAM_CHARS]
    return out


def metric_key(name: str) -> str:
    """A name MLflow accepts: `@` reads `_at_` (`pass@k` -> `pass_at_k`), other odd chars `_`."""
    name = re.sub(r"[^/\w.\- :]", "_", name.replace("@", "_at_"))
    return name[:MAX_KEY_CHARS]


def numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric entries (bools as 0/1, NaN kept: it flags divergence) as floats."""
    return {metric_key(k): float(v) for k, v in metrics.items() if isinstance(v, int | float)}


def jsonl(trajectories: Iterable[Trajectory]) -> str:
    """One `Trajectory.to_dict()` per line without TOKEN_FIELDS (`from_dict` still reads it)."""
    lines = []
    for t in trajectories:
        # Blank the token lists first: `to_dict` deep-copies them, slow on long episodes.
        data = replace(
            t,
            token_ids=[],
            loss_mask=[],
            logprobs=[],
            constraints={},
            advantages=None,
            returns=None,
        ).to_dict()
        for name in TOKEN_FIELDS:
            data.pop(name, None)
        lines.append(json.dumps(data, ensure_ascii=False, default=str))
    return "".join(line + "\n" for line in lines)


def saved_run_id(run_dir: Path) -> str | None:
    """The MLflow run id a previous tracker left in `run_dir`, if any."""
    path = Path(run_dir) / RUN_ID_FILE
    if not path.exists():
        return None
    return path.read_text().strip() or None


class MlflowTracker:
    """Logs a run's params, metrics and trajectories to MLflow.

    Args:
        run_dir: the run folder: holds `mlflow_run_id` (and the default store).
        uri: tracking URI of a server or another store; None: SQLite in `run_dir`.
        experiment: MLflow experiment name, created when missing.
        run_name: MLflow run name.
        params: the resolved config (nested), logged flattened as params.
        log_trajectories: trajectories logged per step (JSONL and traces); 0: none.
        log_eval_trajectories: episodes of an evaluation logged as JSONL (None: as
            `log_trajectories`); traces keep to `log_trajectories`.
        traces: also log them as MLflow traces.
        resume_run_id: continue this MLflow run; None: the one saved in `run_dir`
            when `resume`, else a new run.
        resume: False to always start a new MLflow run.
        tags: extra tags set on the run.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        uri: str | None = None,
        experiment: str = "agentgym",
        run_name: str = "",
        params: Mapping[str, Any] | None = None,
        log_trajectories: int = 8,
        log_eval_trajectories: int | None = None,
        traces: bool = True,
        resume_run_id: str | None = None,
        resume: bool = True,
        tags: Mapping[str, str] | None = None,
    ) -> None:
        quiet_mlflow()
        from mlflow import MlflowClient

        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.uri = uri or sqlite_uri(self.run_dir / STORE_FILE)
        self.log_trajectories = log_trajectories
        self.log_eval_trajectories = (
            log_trajectories if log_eval_trajectories is None else log_eval_trajectories
        )
        self.client = MlflowClient(tracking_uri=self.uri)
        self.experiment_id = self._experiment(experiment)
        wanted = resume_run_id or (saved_run_id(self.run_dir) if resume else None)
        self._run_id = self._open_run(wanted, run_name, dict(tags or {}))
        (self.run_dir / RUN_ID_FILE).write_text(self._run_id + "\n")
        self._log_params(flatten(params or {}))
        self._traces = None
        if traces and max(log_trajectories, self.log_eval_trajectories) > 0:
            from agentgym_core.tracking.traces import TraceWriter

            self._traces = TraceWriter(
                self.uri, run_id=self._run_id, experiment_id=self.experiment_id
            )
        self._rollout_logged: tuple[int, dict[str, float]] = (-1, {})
        self._closed = False

    @property
    def run_id(self) -> str:
        """The MLflow run this tracker writes to."""
        return self._run_id

    # -- setup -------------------------------------------------------------

    def _experiment(self, name: str) -> str:
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        return self.client.create_experiment(name, artifact_location=artifact_root(self.uri))

    def _open_run(self, run_id: str | None, run_name: str, tags: dict[str, str]) -> str:
        from mlflow.exceptions import MlflowException

        if run_id:
            try:
                run = self.client.get_run(run_id)
            except MlflowException:
                _log.warning("MLflow run %s not found in %s; starting a new run", run_id, self.uri)
            else:
                if run.info.status != "RUNNING":
                    self.client.update_run(run_id, status="RUNNING")
                return run_id
        return self.client.create_run(
            self.experiment_id, run_name=run_name or None, tags=tags
        ).info.run_id

    def _log_params(self, params: dict[str, str]) -> None:
        from mlflow.entities import Param

        # Params are immutable in MLflow: a resumed run keeps its first values.
        existing = self.client.get_run(self._run_id).data.params
        changed = sorted(k for k, v in params.items() if k in existing and existing[k] != v)
        if changed:
            _log.warning("resumed MLflow run keeps its old values of params %s", changed)
        fresh = [Param(k, v) for k, v in params.items() if k not in existing]
        for i in range(0, len(fresh), _PARAMS_PER_BATCH):
            self.client.log_batch(self._run_id, params=fresh[i : i + _PARAMS_PER_BATCH])

    # -- writing -------------------------------------------------------------

    def log_metrics(self, step: int, metrics: Mapping[str, Any], prefix: str = "") -> None:
        """Log every numeric entry of `metrics` at `step`, in batches."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        rows = [
            Metric(f"{prefix}{k}"[:MAX_KEY_CHARS], v, now, step)
            for k, v in numeric(metrics).items()
        ]
        for i in range(0, len(rows), _METRICS_PER_BATCH):
            self.client.log_batch(self._run_id, metrics=rows[i : i + _METRICS_PER_BATCH])

    def log_episodes(
        self, step: int, trajectories: Sequence[Trajectory], *, split: str = "train"
    ) -> list[str]:
        """Log episodes as JSONL (and traces); returns trace ids.

        Train episodes (`log_trajectories` of them) go to
        `trajectories/step-000012.jsonl`, an evaluation's
        (`log_eval_trajectories`) to `trajectories/<split>/step-000012.jsonl`.
        Traces keep to the first `log_trajectories` of them.
        """
        count = self.log_trajectories if split == "train" else self.log_eval_trajectories
        chosen = round_robin(trajectories, count)
        if not chosen:
            return []
        folder = "trajectories" if split == "train" else f"trajectories/{split}"
        self.client.log_text(self._run_id, jsonl(chosen), f"{folder}/step-{step:06d}.jsonl")
        traced = chosen[: self.log_trajectories]
        if self._traces is None or not traced:
            return []
        try:
            return self._traces.write(traced, step=step, split=split)
        except Exception as error:  # traces are a view: never stop training for them
            _log.warning("MLflow traces disabled after an error: %s", error)
            self._traces = None
            return []

    def close(self, status: str = "FINISHED") -> None:
        """End the run (`FINISHED`, `FAILED` or `KILLED`); later calls do nothing."""
        if not self._closed:
            self._closed = True
            self.client.set_terminated(self._run_id, status=status)

    def __enter__(self) -> MlflowTracker:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.close("FINISHED" if exc_type is None else "FAILED")

    # -- hooks ---------------------------------------------------------------

    @hookimpl
    def agentgym_after_rollout(
        self, step: int, batch: TrajectoryBatch, metrics: Mapping[str, float]
    ) -> None:
        """Log rollout metrics now (the update may take long) and the step's episodes."""
        self.log_metrics(step, metrics)
        self._rollout_logged = (step, numeric(metrics))
        self.log_episodes(step, batch.trajectories)

    @hookimpl
    def agentgym_after_update(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log the step's metrics, less those `after_rollout` already logged unchanged."""
        logged_step, logged = self._rollout_logged
        values = numeric(metrics)
        if logged_step == step:
            values = {k: v for k, v in values.items() if logged.get(k) != v}
        self.log_metrics(step, values)

    @hookimpl
    def agentgym_after_evaluation(
        self, step: int, split: str, metrics: Mapping[str, float]
    ) -> None:
        """Log evaluation metrics as `eval/<split>/<name>` at `step`, and say how complete.

        Beside the metrics (`partial` among them, 1.0 when episodes ended in
        env_error) the run gets tags `agentgym.eval.<split>.partial` (`true` or
        `false`) and `agentgym.eval.<split>` (`success 0.571 over 7 of 80
        episodes: PARTIAL, 73 env_error`), so no one reads a partial rate as a
        whole one in MLflow's UI.
        """
        self.log_metrics(step, metrics, prefix=f"eval/{split}/")
        if "episodes" in metrics and "success_rate" in metrics:
            episodes, played = measured(dict(metrics))
            partial = episodes != played or bool(metrics.get("partial"))
            summary = f"success {metrics['success_rate']:.3f} over {episodes} of {played} episodes"
            if partial:
                summary += f": PARTIAL, {played - episodes} env_error"
            tag = metric_key(f"agentgym.eval.{split}")
            self.client.set_tag(self._run_id, f"{tag}.partial", str(partial).lower())
            self.client.set_tag(self._run_id, tag, summary)

    @hookimpl
    def agentgym_on_checkpoint(self, step: int, path: Path) -> None:
        """Record where the latest checkpoint is (tags); weights stay on disk, not copied."""
        self.client.set_tag(self._run_id, "agentgym.checkpoint", str(path))
        self.client.set_tag(self._run_id, "agentgym.checkpoint_step", str(step))
