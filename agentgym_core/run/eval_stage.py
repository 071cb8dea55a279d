"""Evaluation stages: the `eval` stage kind, `agentgym eval`, and side-by-side comparisons."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentgym_core import distributed
from agentgym_core.config.stages import Stage, expand_stages
from agentgym_core.evaluation.metrics import measured
from agentgym_core.numerics import subnormals_flushed
from agentgym_core.plugins import PluginHost
from agentgym_core.rollout.text import is_text_level
from agentgym_core.run.components import (
    Components,
    build_components,
    check_context_fits,
    load_configured_model,
)
from agentgym_core.run.evaluate import (
    EvalSettings,
    error_retries,
    evaluate_model,
    evaluate_text_policy,
    partial_note,
)
from agentgym_core.run.kinds import StageContext, StageOutcome
from agentgym_core.run.rollout_step import rollout_settings
from agentgym_core.tracking.console import format_table
from agentgym_core.types import Trajectory


def eval_settings(
    root: Any,
    components: Components,
    *,
    steps: int,
    history: list[dict[str, float]] | None = None,
) -> EvalSettings:
    """Eval settings from the `eval` block; the horizon defaults to the scheduler's at `steps`."""
    block = root.eval
    max_turns = block.max_turns
    if max_turns is None:
        max_turns = components.scheduler.max_turns(max(steps - 1, 0), history or [])
    return EvalSettings(
        split=block.split,
        num_tasks=block.num_tasks,
        k=block.k,
        max_turns=max_turns,
        greedy=block.greedy,
        temperature=block.temperature,
        seed=root.run.seed,
        env_error_retries=error_retries(root),
        env_recovery_s=root.rollout.env_recovery_s,
        outage_fraction=root.trainer.outage_fraction,
        constrained=block.constrained,
    )


def run_eval_stage(
    resolved: Any, host: PluginHost, model_path: Path, *, step: int = 0
) -> tuple[dict[str, float], list[Trajectory]]:
    """Evaluate the weights at `model_path` on the configured split."""
    with subnormals_flushed():  # a trained model's subnormals would slow the CPU (numerics.py)
        return _evaluate(resolved, host, model_path, step)


def _evaluate(
    resolved: Any, host: PluginHost, model_path: Path, step: int
) -> tuple[dict[str, float], list[Trajectory]]:
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
        check_context_fits(model, root.rollout.max_context_tokens, model_path)
        metrics, trajectories = evaluate_model(
            model, tokenizer, components, settings, rollout, env_threads=threads
        )
    host.after_evaluation(step, settings.split, metrics)
    return metrics, trajectories


class EvalStage:
    """The `eval` stage kind: evaluate the weights the stage starts from; pass them on."""

    def __init__(self, context: StageContext, options: Any = None) -> None:
        self.context = context

    def run(self, *, show_progress: bool = True, quiet: bool = False) -> StageOutcome:
        """Evaluate, print the table, log and save the episodes (main process)."""
        context = self.context
        block = context.config.root.eval
        metrics, trajectories = run_eval_stage(context.config, context.host, context.start_model)
        if context.tracker is not None:
            context.tracker.log_episodes(0, trajectories, split=block.split)
            table = eval_table(metrics, block.k)
            print(f"[{context.name}] {context.start_model}\n{table}")
            if note := partial_note(metrics, trajectories):
                print(f"agentgym: [{context.name}] {note}", flush=True)
        if context.recorder is not None:
            context.recorder.save_evaluation(block.split, trajectories)
        return StageOutcome(context.start_model, metrics=metrics)


def eval_table(metrics: dict[str, float], k: int) -> str:
    """Overall and per-group results as a text table.

    A partial result (episodes in env_error) opens with a PARTIAL line, and a
    row with env errors shows its success rate with its episode count and
    PARTIAL beside it: `0.571 (7 of 8 episodes, PARTIAL)`.
    """
    groups = sorted({key.split("/")[1] for key in metrics if key.startswith("group/")})
    keys = ["mean_reward", "avg@k", "pass@k", "episodes", "env_errors"]
    columns = ["group", "success_rate", "mean_reward", f"avg@{k}", f"pass@{k}", "episodes"]
    columns.append("env_errors")

    def row(name: str, prefix: str) -> dict[str, object]:
        values = [_value(metrics, prefix, key) for key in keys]
        success = rate_cell(metrics, prefix)
        return dict(zip(columns, [name, success, *values], strict=True))

    rows = [row("all", "")] + [row(group, f"group/{group}/") for group in groups]
    return _with_heading(format_table(rows, columns), [partial_heading(metrics)])


def rate_cell(metrics: dict[str, float], prefix: str = "") -> object:
    """A success rate as a table cell: the number, or with its count and PARTIAL beside it."""
    episodes, played = measured(metrics, prefix)
    value = metrics.get(prefix + "success_rate") if episodes else None
    if episodes == played:
        return value
    shown = "-" if value is None else f"{value:.3f}"
    return f"{shown} ({episodes} of {played} episodes, PARTIAL)"


def partial_heading(metrics: dict[str, float], name: str = "") -> str:
    """The line above a partial result's table ('' when complete)."""
    episodes, played = measured(metrics)
    if episodes == played:
        return ""
    where = f"[{name}] " if name else ""
    return (
        f"{where}PARTIAL EVALUATION: {played - episodes} of {played} episodes ended in "
        f"env_error; the rates below count only the {episodes} measured."
    )


RATES = ("success_rate", "mean_reward", "avg@k", "pass@k", "mean_turns")
"""Metrics that are averages over measured episodes: none without one."""


def eval_record(metrics: dict[str, float], note: str = "", last_error: str = "") -> dict:
    """The JSON of `agentgym eval --json`: a partial result says so before any rate.

    Keys in order: `partial` (bool), with a partial result `warning` (the
    PARTIAL line) and `last_env_error`, then `episodes` (measured),
    `episodes_played` and `env_errors`, then every metric; a rate over no
    measured episode (a group all of whose episodes failed) is null, not 0.
    """
    episodes, played = measured(metrics)
    partial = episodes != played or bool(metrics.get("partial"))
    head: dict[str, object] = {"partial": partial}
    if partial:
        head["warning"] = note or partial_heading(metrics)
        if last_error:
            head["last_env_error"] = last_error
    head.update(episodes=episodes, episodes_played=played, env_errors=played - episodes)
    rest: dict[str, object] = {}
    for key, value in metrics.items():
        if key in head or key == "partial":
            continue
        prefix, _, name = key.rpartition("/")
        empty = name in RATES and measured(metrics, prefix + "/" if prefix else "")[0] == 0
        rest[key] = None if empty else value
    return {**head, **rest}


def _value(metrics: dict[str, float], prefix: str, key: str) -> float | int | None:
    """A cell of a table row: counts as ints; a rate of no measured episode is None (`-`)."""
    if key in ("episodes", "env_errors"):
        return int(metrics.get(prefix + key, 0))
    if measured(metrics, prefix)[0] == 0:
        return None
    return metrics.get(prefix + key, 0.0)


def _with_heading(table: str, lines: list[str]) -> str:
    return "\n".join([*(line for line in lines if line), table])


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
    """One row per stage: its policy, per-group success, then the overall metrics.

    A stage with env errors shows its success rates as `eval_table` does,
    and the table opens with a PARTIAL line for it.
    """
    groups = sorted(
        {key.split("/")[1] for _, metrics in results for key in metrics if key.startswith("group/")}
    )
    rows = []
    for stage, metrics in results:
        root = stage.config.root
        row: dict[str, object] = {"stage": stage.name, "policy": root.policy.name, "k": root.eval.k}
        row.update({g: rate_cell(metrics, f"group/{g}/") for g in groups})
        row["success_rate"] = rate_cell(metrics)
        row.update({key: _value(metrics, "", key) for key in ("avg@k", "pass@k")})
        row.update({key: _value(metrics, "", key) for key in ("episodes", "env_errors")})
        rows.append(row)
    columns = ["stage", "policy", *groups, "success_rate", "k", "avg@k", "pass@k"]
    columns += ["episodes", "env_errors"]
    headings = [partial_heading(metrics, stage.name) for stage, metrics in results]
    return _with_heading(format_table(rows, columns), headings)
