"""Run a config's stages in order, each as its registered kind (`kinds`), from the previous weights.

Under `accelerate launch` every rank runs every stage; only the main process
saves the config, tracks to MLflow, records rollouts and prints.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentgym_core import distributed
from agentgym_core.config.stages import Stage, expand_stages
from agentgym_core.plugins import PluginHost
from agentgym_core.run.finished import RECORD, finished_outcome, record_outcome
from agentgym_core.run.kinds import StageOutcome, run_stage
from agentgym_core.run.offline import stage_prefix
from agentgym_core.run.saved_rollouts import RolloutRecorder, start_recording, stop_recording
from agentgym_core.tracking.mlflow_tracker import MlflowTracker, sqlite_uri


@dataclass
class StageResult:
    """What one stage produced."""

    name: str
    type: str
    model: Path
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def _tracker(resolved: Any, stage_name: str, store_dir: Path) -> MlflowTracker:
    """One MLflow run per stage, all in the pipeline's store (`<output_dir>/mlflow.db`)."""
    root = resolved.root
    run_dir = Path(root.run.output_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    return MlflowTracker(
        run_dir,
        uri=root.tracking.uri or sqlite_uri(store_dir / "mlflow.db"),
        experiment=root.tracking.experiment,
        run_name=f"{root.run.name}/{stage_name}",
        params=resolved.to_dict(),
        log_trajectories=root.tracking.log_trajectories,
        log_eval_trajectories=root.tracking.log_eval_trajectories,
        traces=root.tracking.traces,
        resume=root.trainer.resume,
        tags={**viewer_note(store_dir, root.tracking.uri), **root.tracking.tags},
    )


def viewer_note(store_dir: Path, uri: str | None) -> dict[str, str]:
    """The MLflow run's description (shown in `agentgym ui`): how to see its episodes.

    Only for the run folder's own store: the viewer reads that folder.
    """
    if uri:
        return {}
    note = (
        "Episodes turn by turn (frames, filters, two stages side by side): "
        f"`agentgym view {store_dir}`"
    )
    return {"mlflow.note.content": note}


@contextlib.contextmanager
def _observed(
    stage: Stage, host: PluginHost, store_dir: Path
) -> Iterator[tuple[MlflowTracker | None, RolloutRecorder | None]]:
    """The stage's MLflow run and rollout recorder: on the main process, None elsewhere."""
    if not distributed.is_main():
        yield None, None
        return
    stage.config.save(Path(stage.config.root.run.output_dir) / "config.yaml")
    tracker = _tracker(stage.config, stage.name, store_dir)
    host.pm.register(tracker, name=f"mlflow-{stage.name}")
    recorder = start_recording(stage.config, host)
    try:
        yield tracker, recorder
        tracker.close("FINISHED")
    except BaseException:
        tracker.close("FAILED")
        raise
    finally:
        host.pm.unregister(tracker)
        stop_recording(host, recorder)


def _say_finished(stage: Stage, outcome: StageOutcome) -> None:
    """Say that a stage is taken from its record; an evaluation's table is shown again."""
    print(f"[{stage.name}] finished earlier: its {RECORD} is taken, not run again")
    if stage.type == "eval":
        from agentgym_core.run.eval_stage import eval_table

        print(eval_table(outcome.metrics, stage.config.root.eval.k))


def _run(
    stage: Stage,
    index: int,
    resolved: Any,
    host: PluginHost,
    model_path: Path,
    earlier: dict[str, Path],
    show_progress: bool,
    quiet: bool,
) -> StageOutcome:
    """Run one stage as its kind, tracked and recorded on the main process."""
    with _observed(stage, host, Path(resolved.root.run.output_dir)) as (tracker, recorder):
        return run_stage(
            stage.config,
            host,
            kind=stage.kind,
            name=stage.name,
            options=stage.options,
            start_model=model_path,
            earlier=earlier,
            prefix=stage_prefix(resolved, index),
            tracker=tracker,
            recorder=recorder,
            show_progress=show_progress,
            quiet=quiet,
        )


def run_pipeline(
    resolved: Any, host: PluginHost, *, show_progress: bool = True, quiet: bool = False
) -> list[StageResult]:
    """Run every stage as its registered kind; each starts from the previous stage's checkpoint.

    A stage that finished in an earlier run of the same pipeline is not run again (`finished`).
    """
    model_path = Path(resolved.root.model.path)
    store_dir = Path(resolved.root.run.output_dir)
    store_dir.mkdir(parents=True, exist_ok=True)
    results: list[StageResult] = []
    stages = expand_stages(resolved)
    earlier: dict[str, Path] = {}  # output dirs of finished stages, for offline data sources
    for index, stage in enumerate(stages):
        start = time.perf_counter()
        Path(stage.config.root.run.output_dir).mkdir(parents=True, exist_ok=True)
        if done := finished_outcome(stage, model_path):
            outcome, seconds = done
            if distributed.is_main() and not quiet:
                _say_finished(stage, outcome)
        else:
            outcome = _run(stage, index, resolved, host, model_path, earlier, show_progress, quiet)
            seconds = time.perf_counter() - start
            if distributed.is_main():
                record_outcome(stage, model_path, outcome, seconds)
        model_path = outcome.checkpoint
        distributed.wait()  # the main process's files of this stage exist before any rank reads
        earlier[stage.name] = Path(stage.config.root.run.output_dir)
        results.append(
            StageResult(stage.name, stage.type, model_path, dict(outcome.metrics), seconds)
        )
    return results
