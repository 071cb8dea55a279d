"""One online training stage: rollouts in, advantages, update, weights out, one update at a time.

    tasks -> rollout source -> batch -> scoring -> advantages -> learner -> weights -> source

The rollout source (`sources`) owns tasks, seeds, the horizon, outage recovery
and staleness; the learner (`learner.learner`) owns the weights. The stage only
passes batches one way and weights the other, and tracks, checkpoints and
evaluates on the way. Every random choice of update t derives from
(run.seed, t), and the learner's shuffle state, optimizer and RNGs are
checkpointed, so a run resumed from the checkpoint of update t continues
exactly as the uninterrupted run would.

Under `accelerate launch` every rank plays its share of each update's episodes
and holds the whole batch; the learner splits the update (see `distributed`),
so N ranks train as one process would on the same batch.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym_core.config.errors import Problem, dotted
from agentgym_core.learner.scoring import score
from agentgym_core.rollout.text import is_text_level
from agentgym_core.run.components import Components, build_components
from agentgym_core.run.eval_stage import eval_settings
from agentgym_core.run.evaluate import evaluation_tasks, run_evaluation
from agentgym_core.run.kinds import StageContext, StageOutcome, last_metrics, raise_problems
from agentgym_core.run.rollout_step import rollout_settings
from agentgym_core.run.runtime import Checkpoints, open_learner, stage_progress
from agentgym_core.run.sources import Rollout, RolloutSource, open_rollouts


class TrainStage:
    """Runs one `train` stage of an online algorithm (the `train` stage kind)."""

    def __init__(self, context: StageContext, options: Any = None) -> None:
        self.context = context
        self.root = context.config.root
        raise_problems(self.check(context.config, context.prefix), context.config)
        self.components: Components = build_components(context.config)
        self.algorithm = self.components.algorithm

    @staticmethod
    def check(
        config: Any, prefix: Sequence[Any] = (), earlier: Sequence[Any] = ()
    ) -> list[Problem]:
        """An algorithm, a scheduler, a token-level policy, big enough groups; one rank if stale."""
        root = config.root
        at = lambda key: dotted((*prefix, key))  # noqa: E731
        problems = [
            Problem(at(block), f"a train stage needs {block} (none is set)")
            for block in ("algorithm", "scheduler")
            if getattr(root, block) is None
        ]
        if is_text_level(config.components["policy"][0].factory):
            problems.append(
                Problem(
                    at("policy.name"),
                    f"policy {root.policy.name!r} is text-level (a chat API returns text, "
                    "not sampled token ids and log-probabilities): it can evaluate, not train; "
                    "train with a token-level policy such as `hf` or `vllm`",
                )
            )
        if "algorithm" in config.components:
            registration, options = config.components["algorithm"]
            needs = getattr(registration.factory(options), "needs", None)
            needed = getattr(needs, "group_size", 1)
            if root.trainer.group_size < needed:
                problems.append(
                    Problem(
                        at("trainer.group_size"),
                        f"{root.algorithm.name} needs at least "
                        f"{needed} samples per task (got {root.trainer.group_size})",
                    )
                )
        return problems

    def run(self, *, show_progress: bool = True, quiet: bool = False) -> StageOutcome:
        """Train to `trainer.steps`, resuming from the latest checkpoint when allowed."""
        root, context = self.root, self.context
        output_dir = Path(root.run.output_dir)
        opened = open_learner(root, self.algorithm, context.start_model, output_dir)
        learner, history = opened.learner, opened.history
        checkpoints = Checkpoints(root, output_dir, context.host, opened.weights)
        rollouts = open_rollouts(
            context.config,
            self.components,
            learner.unwrapped,
            opened.tokenizer,
            version=opened.first_step,
            saved=opened.saved,
            start_model=context.start_model,
            weights_path=opened.weights,
            newest=lambda: checkpoints.latest,
        )
        progress = None
        try:
            progress = stage_progress(root, opened.first_step, show=show_progress, quiet=quiet)
            for step in range(opened.first_step, root.trainer.steps):
                rollout = rollouts.take(step, history)
                context.host.after_rollout(step, rollout.batch, rollout.metrics)
                metrics = self._learn(rollout, learner, rollouts, step)
                history.append(metrics)
                context.host.after_update(step, metrics)
                progress.update(step + 1, metrics)
                if checkpoints.due(step + 1):
                    extra = rollouts.checkpoint_state()
                    checkpoints.save(step + 1, learner, opened.tokenizer, history, extra)
                if root.trainer.eval_every and (step + 1) % root.trainer.eval_every == 0:
                    self._evaluate(step + 1, rollouts, history)
        finally:
            if progress is not None:
                progress.close()
            rollouts.close()
        return StageOutcome(checkpoints.latest, history, opened.first_step, last_metrics(history))

    def _learn(self, rollout: Rollout, learner: Any, rollouts: RolloutSource, step: int) -> dict:
        """Score, advantages, update; the new weights go to the rollout source."""
        start = time.perf_counter()
        batch, metrics = rollout.batch, rollout.metrics
        score(learner, batch.trainable)  # reference log-probs and critic values, where needed
        self.algorithm.advantages(batch)
        metrics.update({f"train/{k}": v for k, v in learner.update(batch).items()})
        rollouts.push(learner.unwrapped, version=step + 1)
        metrics["step_seconds"] += time.perf_counter() - start
        return metrics

    def _evaluate(
        self, step: int, rollouts: RolloutSource, history: list[dict[str, float]]
    ) -> dict[str, float]:
        settings = eval_settings(self.root, self.components, steps=step, history=history)
        tasks = evaluation_tasks(self.components.env_factory, settings.split, settings.num_tasks)
        rollout = rollout_settings(self.root, max_turns=settings.max_turns, seed=self.root.run.seed)
        metrics, _ = run_evaluation(rollouts.evaluation_engine(), tasks, settings, rollout)
        self.context.host.after_evaluation(step, settings.split, metrics)
        return metrics
