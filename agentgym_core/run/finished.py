"""A pipeline's finished stages are not run again when the pipeline is rerun.

Training stages resume from their newest checkpoint, but a killed pipeline
would otherwise replay every evaluation stage before the one it died in: an
hour each for a real model on a CPU. So each stage that finishes leaves
`stage_outcome.json` in its output folder: a digest of its resolved config,
the weights it started from, and its outcome. A rerun with `trainer.resume`
(the default) takes that outcome instead of running the stage, as long as the
config and start weights are the same (path, file sizes and times) and the
checkpoint it names still exists; anything else runs the stage again, and so
does an evaluation that was partial (episodes in env_error).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from agentgym_core.config.stages import Stage
from agentgym_core.run.kinds import StageOutcome

RECORD = "stage_outcome.json"


def config_digest(stage: Stage) -> str:
    """sha256 of the stage's type, options and resolved config: any change runs it again."""
    options = stage.options.model_dump(mode="json") if stage.options is not None else None
    whole = {"type": stage.type, "options": options, "config": stage.config.to_dict()}
    text = json.dumps(whole, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def weights_stamp(folder: Path) -> str:
    """sha256 of the names, sizes and times of the files in `folder`: new weights, new stamp."""
    try:
        files = sorted(p for p in Path(folder).iterdir() if p.is_file())
    except OSError:
        return ""
    stats = [(p.name, stat.st_size, stat.st_mtime_ns) for p in files for stat in [p.stat()]]
    return hashlib.sha256(json.dumps(stats).encode()).hexdigest()


def record_outcome(
    stage: Stage, start_model: Path, outcome: StageOutcome, seconds: float
) -> Path | None:
    """Write the record of a finished stage (main process), atomically; a partial eval gets none."""
    if outcome.metrics.get("partial"):
        return None
    path = Path(stage.config.root.run.output_dir) / RECORD
    record = {
        "config_sha256": config_digest(stage),
        "start_model": str(start_model),
        "start_weights": weights_stamp(start_model),
        "checkpoint": str(outcome.checkpoint),
        "metrics": outcome.metrics,
        "history": outcome.history,
        "resumed_from": outcome.resumed_from,
        "seconds": seconds,
    }
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(record, indent=1))
    os.replace(partial, path)
    return path


def finished_outcome(stage: Stage, start_model: Path) -> tuple[StageOutcome, float] | None:
    """The recorded outcome of this stage run earlier on the same config and start, if any."""
    if not stage.config.root.trainer.resume:
        return None
    path = Path(stage.config.root.run.output_dir) / RECORD
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # none, or cut short: run the stage
    same = (
        record.get("config_sha256") == config_digest(stage)
        and record.get("start_model") == str(start_model)
        and record.get("start_weights") == weights_stamp(start_model)
        and bool(record.get("checkpoint"))
        and Path(record["checkpoint"]).exists()
    )
    if not same:
        return None
    outcome = StageOutcome(
        Path(record["checkpoint"]),
        history=record["history"],
        resumed_from=record["resumed_from"],
        metrics=record["metrics"],
    )
    return outcome, float(record["seconds"])
