"""Run a config's stages in order, each starting from the previous stage's weights.

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
from agentgym_core.rollout.text import is_text_level
from agentgym_core.run.components import build_components, load_configured_model
from agentgym_core.run.evaluate import evaluate_model, evaluate_text_policy, partial_note
from agentgym_core.run.evolve import EvolveStage
from agentgym_core.run.offline import (
    RolloutRecorder,
    check_stage_sources,
    make_train_stage,
    stage_prefix,
    start_recording,
    stop_recording,
)
from agentgym_core.run.train import eval_settings, rollout_settings
from agentgym_core.tracking.console import format_table
from agentgym_core.tracking.mlflow_tracker import MlflowTracker, sqlite_uri
from agentgym_core.types import Trajectory


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


def run_eval_stage(
    resolved: Any, host: PluginHost, model_path: Path, *, step: int = 0
) -> tuple[dict[str, float], list[Trajectory]]:
    """Evaluate the weights at `model_path` on the configured split."""
    root = resolved.root
    components = build_components(resolved)
    settings = eval_settings(root, components, steps=root.trainer.steps)
    # run_evaluation takes temperature, greedy and seed from `settings`, the rest from here
    rollout = rollout_settings(root, max_turns=settings.max_turns, seed=root.run.seed)
    threads = root.rollout.env_threads
    if is_text_level(resolved.components["policy"][0].factory):
        # a chat API answers text: there are no weights to load from model_path
        metrics, trajectories = evaluate_text_policy(
            components, settings, rollout, env_threads=threads
        )
    else:
        model, tokenizer = load_configured_model(root.model, model_path)
        metrics, trajectories = evaluate_model(
            model, tokenizer, components, settings, rollout, env_threads=threads
        )
    host.after_evaluation(step, settings.split, metrics)
    return metrics, trajectories


def eval_table(metrics: dict[str, float], k: int) -> str:
    """Overall and per-group results as a text table."""
    groups = sorted({key.split("/")[1] for key in metrics if key.startswith("group/")})
    keys = ["success_rate", "mean_reward", "avg@k", "pass@k", "episodes", "env_errors"]
    columns = ["group", "success_rate", "mean_reward", f"avg@{k}", f"pass@{k}", "episodes"]
    columns.append("env_errors")

    def row(name: str, prefix: str) -> dict[str, object]:
        values = [metrics.get(prefix + key, 0.0) for key in keys]
        return dict(zip(columns, [name, *values], strict=True))

    rows = [row("all", "")] + [row(group, f"group/{group}/") for group in groups]
    return format_table(rows, columns)


def is_comparison(resolved: Any) -> bool:
    """True when every stage is `eval`: `agentgym eval` then compares them side by side."""
    stages = resolved.root.stages or []
    return bool(stages) and all(stage.type == "eval" for stage in stages)


def run_comparison(resolved: Any, host: PluginHost) -> list[tuple[Stage, dict[str, float]]]:
    """Evaluate each eval stage (its own policy and model.path) on the same tasks."""
    out = []
    for stage in expand_stages(resolved):
        metrics, trajectories = run_eval_stage(
            stage.config, host, Path(stage.config.root.model.path)
        )
        if (note := partial_note(metrics, trajectories)) and distributed.is_main():
            print(f"agentgym: [{stage.name}] {note}", flush=True)
        out.append((stage, metrics))
    return out


def comparison_table(results: list[tuple[Stage, dict[str, float]]]) -> str:
    """One row per stage: its policy, per-group success, then the overall metrics."""
    groups = sorted(
        {key.split("/")[1] for _, metrics in results for key in metrics if key.startswith("group/")}
    )
    rows = []
    for stage, metrics in results:
        root = stage.config.root
        row: dict[str, object] = {"stage": stage.name, "policy": root.policy.name, "k": root.eval.k}
        row.update({g: metrics.get(f"group/{g}/success_rate") for g in groups})
        row.update({key: metrics.get(key) for key in ("success_rate", "avg@k", "pass@k")})
        row.update(episodes=metrics.get("episodes"), env_errors=metrics.get("env_errors"))
        rows.append(row)
    columns = ["stage", "policy", *groups, "success_rate", "k", "avg@k", "pass@k"]
    columns += ["episodes", "env_errors"]
    return format_table(rows, columns)


def run_pipeline(
    resolved: Any, host: PluginHost, *, show_progress: bool = True, quiet: bool = False
) -> list[StageResult]:
    """Run every stage; a train stage's final checkpoint feeds the next stage."""
    model_path = Path(resolved.root.model.path)
    store_dir = Path(resolved.root.run.output_dir)
    store_dir.mkdir(parents=True, exist_ok=True)
    results: list[StageResult] = []
    stages = expand_stages(resolved)
    check_stage_sources(resolved, stages)
    earlier: dict[str, Path] = {}  # output dirs of finished stages, for offline data sources
    for index, stage in enumerate(stages):
        start = time.perf_counter()
        Path(stage.config.root.run.output_dir).mkdir(parents=True, exist_ok=True)
        with _observed(stage, host, store_dir) as (tracker, recorder):
            if stage.type != "eval":
                runner = EvolveStage if stage.type == "evolve" else make_train_stage
                trained = runner(
                    stage.config,
                    host,
                    start_model=model_path,
                    earlier=earlier,
                    prefix=stage_prefix(resolved, index),
                ).run(show_progress=show_progress, quiet=quiet)
                model_path = trained.checkpoint
                metrics = trained.history[-1] if trained.history else {}
            else:
                metrics, trajectories = run_eval_stage(stage.config, host, model_path)
                split = stage.config.root.eval.split
                if tracker is not None:
                    tracker.log_episodes(0, trajectories, split=split)
                    table = eval_table(metrics, stage.config.root.eval.k)
                    print(f"[{stage.name}] {model_path}\n{table}")
                    if note := partial_note(metrics, trajectories):
                        print(f"agentgym: [{stage.name}] {note}", flush=True)
                if recorder is not None:
                    recorder.save_evaluation(split, trajectories)
        distributed.wait()  # the main process's files of this stage exist before any rank reads
        earlier[stage.name] = Path(stage.config.root.run.output_dir)
        results.append(
            StageResult(
                stage.name, stage.type, model_path, dict(metrics), time.perf_counter() - start
            )
        )
    return results
