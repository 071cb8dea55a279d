"""AgentEvol: behaviour cloning, then rounds of exploring and fine-tuning on what was rewarded.

AgentGym's self-evolution method (arXiv 2406.04151; its reference scripts are
`agentenv/examples/agentevol`): fine-tune on the expert set, then repeatedly
play the train tasks with the newest model, keep the episodes that earned
reward (one per task and round), and fine-tune again on the expert set plus
everything kept so far. Each fine-tune starts from the stage's starting model
by default, as AgentGym's does, so errors do not compound across rounds.

A stage of `type: evolve` runs here. Its algorithm is an offline one that
reads saved trajectories (`sft`); every round is an ordinary offline stage in
`<output_dir>/round-<r>/` with that round's kept episodes added to
`algorithm.trajectories`. Data flows one way: round r's model explores, its
kept episodes (`round-<r+1>/kept.jsonl`) feed round r+1's fine-tune. A
finished round's checkpoint and a written exploration are reused, so a stopped
stage resumes where it stopped.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentgym_core import distributed
from agentgym_core.config.errors import Problem, dotted
from agentgym_core.config.resolve import ResolvedConfig, validate_dict
from agentgym_core.plugins import PluginHost
from agentgym_core.run.components import (
    build_components,
    check_context_fits,
    load_configured_model,
)
from agentgym_core.run.evaluate import EvalSettings, error_retries, evaluate_model
from agentgym_core.run.kinds import StageContext, StageOutcome, last_metrics
from agentgym_core.run.offline import OfflineStage, is_offline, source_problems
from agentgym_core.run.rollout_step import rollout_settings
from agentgym_core.run.saved_rollouts import save_rollouts
from agentgym_core.types import Termination, Trajectory

KEPT = "kept.jsonl"
EXPLORED = "explore.json"


def kept_episodes(
    trajectories: Sequence[Trajectory], *, min_reward: float | None, per_task: int
) -> list[Trajectory]:
    """The rewarded episodes, at most `per_task` per task, in the order played.

    Rewarded means successful, or with `min_reward` set, a reward of at least
    that. Episodes that ended in an env error are never kept.
    """
    counts: dict[Any, int] = {}
    out = []
    for trajectory in trajectories:
        if trajectory.termination == Termination.ENV_ERROR or not trajectory.num_sampled_tokens:
            continue
        rewarded = trajectory.success if min_reward is None else trajectory.reward >= min_reward
        if rewarded and counts.get(trajectory.task_id, 0) < per_task:
            counts[trajectory.task_id] = counts.get(trajectory.task_id, 0) + 1
            out.append(trajectory)
    return out


class _StepOffset:
    """The plugin host as a round sees it: its update numbers continue the stage's."""

    def __init__(self, host: PluginHost, offset: int) -> None:
        self._host, self._offset = host, offset

    def after_update(self, step: int, metrics: Mapping[str, float]) -> None:
        self._host.after_update(self._offset + step, metrics)

    def after_evaluation(self, step: int, split: str, metrics: Mapping[str, float]) -> None:
        self._host.after_evaluation(self._offset + step, split, metrics)

    def on_checkpoint(self, step: int, path: Path) -> None:
        self._host.on_checkpoint(self._offset + step, path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._host, name)


class EvolveStage:
    """Runs one `type: evolve` stage: `evolve.iterations + 1` fine-tunes, explorations between."""

    def __init__(self, context: StageContext, options: Any = None) -> None:
        self.context = context
        self.resolved = context.config
        self.root = context.config.root
        self.options = context.config.root.evolve
        self.output_dir = Path(self.root.run.output_dir)

    @staticmethod
    def check(
        config: ResolvedConfig, prefix: Sequence[Any] = (), earlier: Sequence[Any] = ()
    ) -> list[Problem]:
        """An evolve stage fine-tunes with an offline algorithm that reads saved trajectories."""
        path = dotted((*prefix, "algorithm", "name"))
        if "algorithm" not in config.components:
            return [Problem(path, "an evolve stage needs an algorithm (e.g. sft); none is set")]
        registration, options = config.components["algorithm"]
        fields = getattr(registration.config, "model_fields", {})
        if not is_offline(registration.factory(options)) or "trajectories" not in fields:
            return [
                Problem(
                    path,
                    "an evolve stage fine-tunes with an offline algorithm that reads saved "
                    f"trajectories (option `trajectories`, as sft); {registration.name!r} does not",
                )
            ]
        return source_problems(config, prefix, earlier)

    def run(self, *, show_progress: bool = True, quiet: bool = False) -> StageOutcome:
        """Every round in order; returns the last fine-tune's checkpoint and all metrics."""
        context = self.context
        model = context.start_model
        kept_files: list[Path] = []
        history: list[dict[str, float]] = []
        steps = self.root.trainer.steps
        for round_index in range(self.options.iterations + 1):
            folder = self.output_dir / f"round-{round_index}"
            offset = round_index * steps
            if round_index:
                explored = self.explore(model, folder, round_index, offset)
                history.append(explored)
                if explored["evolve/kept"]:
                    kept_files.append(folder / KEPT)
            start = context.start_model if self.options.restart == "start" else model
            round_context = replace(
                context,
                config=self.round_config(folder, kept_files),
                host=_StepOffset(context.host, offset),
                start_model=Path(start),
            )
            result = OfflineStage(round_context).run(show_progress=show_progress, quiet=quiet)
            model = result.checkpoint
            history += [{**m, "evolve/round": float(round_index)} for m in result.history]
        return StageOutcome(model, history, 0, last_metrics(history))

    def round_config(self, folder: Path, kept_files: Sequence[Path]) -> ResolvedConfig:
        """The stage's config with the round's output folder and the kept episodes added."""
        raw = copy.deepcopy(self.resolved.raw)
        run = raw.setdefault("run", {})
        run.update(output_dir=str(folder), name=f"{self.root.run.name}-{folder.name}")
        algorithm = raw["algorithm"]
        algorithm["trajectories"] = [*algorithm.get("trajectories", []), *map(str, kept_files)]
        return validate_dict(raw, self.resolved.registry, self.context.prefix, self.resolved.source)

    def explore(self, model_path: Path, folder: Path, round_index: int, step: int) -> dict:
        """Play the explored split with `model_path`; keep the rewarded episodes (once)."""
        summary = folder / EXPLORED
        if summary.exists():
            return json.loads(summary.read_text())
        options = self.options
        settings = EvalSettings(
            split=options.split,
            num_tasks=options.num_tasks,
            k=options.samples,
            max_turns=options.max_turns,
            greedy=options.greedy,
            temperature=options.temperature,
            seed=self.root.run.seed + 1_000 * round_index,
            env_error_retries=error_retries(self.root),
            env_recovery_s=self.root.rollout.env_recovery_s,
            outage_fraction=self.root.trainer.outage_fraction,
        )
        rollout = rollout_settings(self.root, max_turns=options.max_turns, seed=settings.seed)
        model, tokenizer = load_configured_model(self.root.model, model_path)
        check_context_fits(model, self.root.rollout.max_context_tokens, model_path)
        metrics, trajectories = evaluate_model(
            model,
            tokenizer,
            build_components(self.resolved),
            settings,
            rollout,
            env_threads=self.root.rollout.env_threads,
        )
        kept = kept_episodes(trajectories, min_reward=options.min_reward, per_task=options.per_task)
        explored = {
            "evolve/round": float(round_index),
            "evolve/explore_success": metrics.get("success_rate", 0.0),
            "evolve/explore_reward": metrics.get("mean_reward", 0.0),
            "evolve/episodes": float(len(trajectories)),
            "evolve/kept": float(len(kept)),
            "evolve/env_steps": float(sum(t.num_turns for t in trajectories)),
            "evolve/sampled_tokens": float(sum(t.num_sampled_tokens for t in trajectories)),
        }
        if distributed.is_main():
            save_rollouts(folder / KEPT, kept)
            summary.write_text(json.dumps(explored, indent=1))
            self.context.host.after_evaluation(step, f"explore-{round_index}", metrics)
            if self.root.tracking.save_rollouts:
                save_rollouts(folder / "explored.jsonl", trajectories)
        distributed.wait()
        return explored
