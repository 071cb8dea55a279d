"""Offline training stages (SFT, DPO): a fixed dataset instead of rollouts.

A `train` stage whose algorithm says `needs.online = False` runs here. It
uses the online stage's Learner (model, AdamW, lr schedule, accelerate) and
the same checkpoints, so `stages: [sft, grpo, eval]` chain through
checkpoints and a resumed stage continues exactly: the examples of step t are
a pure function of (run.seed, t). The dataset is `offline_data.StageData`;
the rollouts earlier stages saved are read with `saved_rollouts`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agentgym_core import distributed
from agentgym_core.config.errors import Problem, dotted
from agentgym_core.data.agenttraj import (
    AgentTrajError,
)
from agentgym_core.interfaces import OfflineAlgorithm
from agentgym_core.learner.learner import Learner
from agentgym_core.learner.sequence import Example, sequence_update
from agentgym_core.numerics import subnormals_flushed
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.run.components import build_components, load_configured_model
from agentgym_core.run.eval_stage import eval_settings
from agentgym_core.run.evaluate import EvalSettings, evaluate_model
from agentgym_core.run.kinds import StageContext, StageOutcome, last_metrics, raise_problems
from agentgym_core.run.offline_data import StageData, data_metrics, step_indices
from agentgym_core.run.rollout_step import rollout_settings
from agentgym_core.run.runtime import Checkpoints, open_learner, stage_progress
from agentgym_core.types import Trajectory

# -- checks across stages ------------------------------------------------------------


def stage_algorithm(resolved: Any) -> Any | None:
    """A fresh instance of the config's algorithm (None without one)."""
    if "algorithm" not in resolved.components:
        return None
    registration, options = resolved.components["algorithm"]
    return registration.factory(options)


def is_offline(algorithm: Any) -> bool:
    """Whether an algorithm trains on a fixed dataset (`needs.online` False)."""
    return algorithm is not None and not algorithm.needs.online


def stage_prefix(resolved: Any, index: int) -> tuple[Any, ...]:
    """Key-path prefix of stage `index` in errors (`stages.1`), none for a config without stages."""
    return ("stages", index) if resolved.root.stages else ()


def source_problems(config: Any, prefix: Sequence[Any], earlier: Sequence[Any]) -> list[Problem]:
    """Every stage the config's offline algorithm reads from ran before and saves rollouts.

    Problems name the option (`stages.2.algorithm.pairs_from`) and the fix.
    """
    algorithm = stage_algorithm(config)
    if not is_offline(algorithm):
        return []
    before = {stage.name: stage for stage in earlier}
    problems = []
    for key, name in algorithm.source_stages().items():
        path = dotted((*prefix, "algorithm", key))
        if name not in before:
            known = ", ".join(before) or "none"
            problems.append(Problem(path, f"no earlier stage named {name!r} (earlier: {known})"))
        elif not before[name].config.root.tracking.save_rollouts:
            fix = dotted(("stages", before[name].index, "tracking.save_rollouts"))
            problems.append(
                Problem(path, f"stage {name!r} does not save its rollouts; set {fix}: true")
            )
    return problems


class OfflineStage:
    """Runs one `train` stage of an offline algorithm (the `offline` stage kind)."""

    def __init__(self, context: StageContext, options: Any = None) -> None:
        self.context = context
        self.resolved = context.config
        self.root = context.config.root
        # its sources were checked with the pipeline's other stages; a missing one names itself
        # when the data loads (`StageData`)
        raise_problems(_needs_offline(context.config, context.prefix), context.config)
        self.components = build_components(self.resolved)
        self.algorithm: OfflineAlgorithm = self.components.algorithm

    @staticmethod
    def check(
        config: Any, prefix: Sequence[Any] = (), earlier: Sequence[Any] = ()
    ) -> list[Problem]:
        """An offline algorithm (SFT, DPO), whose source stages ran before and save rollouts."""
        return _needs_offline(config, prefix) or source_problems(config, prefix, earlier)

    def run(self, *, show_progress: bool = True, quiet: bool = False) -> StageOutcome:
        """Train to `trainer.steps` on the algorithm's examples, resuming when allowed."""
        root, trainer, context = self.root, self.root.trainer, self.context
        output_dir = Path(root.run.output_dir)
        opened = open_learner(root, self.algorithm, context.start_model, output_dir)
        learner, history, first_step = opened.learner, opened.history, opened.first_step
        if first_step >= trainer.steps:  # finished earlier: a re-run pipeline moves on
            return StageOutcome(opened.weights, history, first_step, last_metrics(history))
        model = learner.unwrapped
        examples, dropped, data = self._examples(
            ChatFormat(opened.tokenizer, model.generation_config),
            # a resumed stage's learner has moved on: its data is played by the starting model
            functools.partial(self._play, model if first_step == 0 else None, opened.tokenizer),
        )
        if show_progress and distributed.is_main():
            print(f"[{root.run.name}] {len(examples)} examples ({dropped} left out)")
        checkpoints = Checkpoints(root, output_dir, context.host, opened.weights)
        progress = stage_progress(root, first_step, show=show_progress, quiet=quiet)
        try:
            for step in range(first_step, trainer.steps):
                start = time.perf_counter()
                metrics = self._step(step, learner, examples)
                metrics["step_seconds"] = time.perf_counter() - start
                metrics["data/examples"] = float(len(examples))
                if step == first_step:  # made once per (re)started stage
                    metrics.update(data_metrics(data))
                history.append(metrics)
                context.host.after_update(step, metrics)
                progress.update(step + 1, metrics)
                if checkpoints.due(step + 1):
                    checkpoints.save(step + 1, learner, opened.tokenizer, history)
                if trainer.eval_every and (step + 1) % trainer.eval_every == 0:
                    self._evaluate(step + 1, learner.unwrapped, opened.tokenizer, history)
        finally:
            progress.close()
        return StageOutcome(checkpoints.latest, history, first_step, last_metrics(history))

    def _examples(
        self, chat: ChatFormat, play: Callable[[str, int, int], list[Trajectory]]
    ) -> tuple[list[Example], int, StageData]:
        """The algorithm's examples that fit the context budget and train on something.

        Also returns how many were left out, and the data services that made them (what
        making them cost).
        """
        context = self.context
        data = StageData(
            self.resolved, chat, earlier=context.earlier, prefix=context.prefix, play=play
        )
        try:
            examples = self.algorithm.examples(data)
        except AgentTrajError as exc:
            raise data.error("", str(exc)) from None
        budget = self.root.rollout.max_context_tokens
        kept = [
            example
            for example in examples
            if all(len(s.token_ids) <= budget and sum(s.loss_mask[1:]) > 0 for s in example)
        ]
        if not kept:
            raise data.error(
                "",
                f"no training examples: {len(examples)} built, none with agent tokens "
                f"within rollout.max_context_tokens={budget}",
            )
        return kept, len(examples) - len(kept), data

    def _play(
        self, model: Any | None, tokenizer: Any, split: str, num_tasks: int, max_turns: int
    ) -> list[Trajectory]:
        """One sampled episode of each of the split's first tasks, as training rollouts sample.

        `model` None: the stage's starting weights, loaded for this (a resumed stage's
        learner holds later ones, and its data must be the first run's).
        """
        root = self.root
        if model is None:
            model, tokenizer = load_configured_model(root.model, self.context.start_model)
        settings = EvalSettings(
            split=split,
            num_tasks=num_tasks,
            max_turns=max_turns,
            seed=root.run.seed,
            env_recovery_s=root.rollout.env_recovery_s,
        )
        with subnormals_flushed():
            _, trajectories = self._episodes(model, tokenizer, settings)
        return trajectories

    def _step(self, step: int, learner: Learner, examples: list[Example]) -> dict[str, float]:
        size = self.algorithm.batch_size
        indices = step_indices(step, size, len(examples), self.root.run.seed)
        metrics = sequence_update(
            learner,
            self.algorithm,
            [examples[i] for i in indices],
            micro_batch_tokens=self.root.trainer.micro_batch_tokens,
            share_rows=learner.settings.share_rows,
        )
        out = {f"train/{k}": v for k, v in metrics.items()}
        out["train/epoch"] = (step + 1) * size / len(examples)
        return out

    def _evaluate(
        self, step: int, model: Any, tokenizer: Any, history: list[dict[str, float]]
    ) -> dict[str, float]:
        settings = eval_settings(self.root, self.components, steps=step, history=history)
        metrics, _ = self._episodes(model, tokenizer, settings)
        self.context.host.after_evaluation(step, settings.split, metrics)
        return metrics

    def _episodes(
        self, model: Any, tokenizer: Any, settings: EvalSettings
    ) -> tuple[dict[str, float], list[Trajectory]]:
        """The model's episodes of `settings`, and their metrics, with the stage's rollout."""
        rollout = rollout_settings(self.root, max_turns=settings.max_turns, seed=self.root.run.seed)
        return evaluate_model(
            model,
            tokenizer,
            self.components,
            settings,
            rollout,
            env_threads=self.root.rollout.env_threads,
        )


def _needs_offline(config: Any, prefix: Sequence[Any]) -> list[Problem]:
    """An offline stage trains an offline algorithm."""
    if is_offline(stage_algorithm(config)):
        return []
    name = config.root.algorithm.name if config.root.algorithm else None
    return [
        Problem(
            dotted((*prefix, "algorithm", "name")),
            f"an offline stage trains an offline algorithm (sft, dpo); got {name!r}",
        )
    ]
