"""One online training stage: rollouts, advantages, update, tracking, checkpoints.

Every random choice of step t derives from (run.seed, t), and the learner's
shuffle state, optimizer and RNGs are checkpointed, so a run resumed from the
checkpoint of step t continues exactly as the uninterrupted run would.

Under `accelerate launch` every rank draws the same tasks, plays its share of
the episodes and gathers everyone's, so advantages and metrics are those of the
full batch on every rank; the learner splits the update (see `distributed`).
Per-request sampling seeds make an episode's tokens independent of which rank
played it, so N ranks train as one process would on the same batch.
"""

from __future__ import annotations

import copy
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentgym_core import distributed
from agentgym_core.config.errors import ConfigError, Problem
from agentgym_core.learner.learner import Learner, LearnerSettings
from agentgym_core.plugins import PluginHost
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.rollout.engine import (
    EnvironmentDown,
    EpisodeSpec,
    RolloutEngine,
    RolloutSettings,
)
from agentgym_core.rollout.text import is_text_level
from agentgym_core.run import recovery
from agentgym_core.run.ahead import RolloutsAhead, ThreadPlayer
from agentgym_core.run.checkpoint import (
    latest_checkpoint,
    restore_learner,
    save_learner_checkpoint,
)
from agentgym_core.run.components import (
    Components,
    build_components,
    load_configured_model,
    load_critic,
)
from agentgym_core.run.evaluate import EvalSettings, evaluation_tasks, run_evaluation
from agentgym_core.run.metrics import rollout_metrics
from agentgym_core.run.rollout_process import ProcessPlayer
from agentgym_core.tracking.console import ProgressBar
from agentgym_core.types import TrajectoryBatch


@dataclass
class TrainResult:
    """Where a training stage left its weights, and its metrics."""

    checkpoint: Path
    history: list[dict[str, float]]
    resumed_from: int


def rollout_settings(root: Any, *, max_turns: int, seed: int) -> RolloutSettings:
    """Rollout settings of one step from the `rollout` config block."""
    block = root.rollout
    return RolloutSettings(
        max_turns=max_turns,
        max_context_tokens=block.max_context_tokens,
        max_new_tokens=block.max_new_tokens,
        temperature=block.temperature,
        constrained=block.constrained,
        env_timeout_s=block.env_timeout_s,
        concurrency=block.concurrency,
        seed=seed,
        frames=root.tracking.frames,
    )


def stage_progress(root: Any, first_step: int, *, show: bool, quiet: bool) -> ProgressBar:
    """A stage's progress bar and update lines, drawn by the main rank only."""
    main = distributed.is_main()
    return ProgressBar(
        root.trainer.steps,
        first_step,
        enabled=show and main,
        lines=not quiet and main,
        label=root.run.name,
    )


def step_seed(run_seed: int, step: int) -> int:
    """Seed of everything random in update `step`."""
    return run_seed * 1_000_003 + step


def sample_tasks(train_tasks: list[int], count: int, seed: int) -> list[int]:
    """Tasks of one step, without replacement where possible."""
    rng = random.Random(seed)
    if count <= len(train_tasks):
        return rng.sample(train_tasks, count)
    return [rng.choice(train_tasks) for _ in range(count)]


class TrainStage:
    """Runs one `train` stage of a resolved config."""

    def __init__(self, resolved: Any, host: PluginHost, *, start_model: str | Path | None = None):
        self.resolved = resolved
        self.root = resolved.root
        self.host = host
        self.output_dir = Path(self.root.run.output_dir)
        self.start_model = Path(start_model or self.root.model.path)
        check_trainable(resolved)
        self.components: Components = build_components(resolved)
        if self.root.trainer.max_staleness and distributed.world_size() > 1:
            raise ConfigError(
                [
                    Problem(
                        "trainer.max_staleness",
                        "rollouts ahead of the learner need a single process "
                        f"(this run has {distributed.world_size()}); set it to 0",
                    )
                ],
                str(resolved.source) if resolved.source else None,
            )
        needed = self.components.algorithm.needs.group_size
        if self.root.trainer.group_size < needed:
            raise ConfigError(
                [
                    Problem(
                        "trainer.group_size",
                        f"{self.root.algorithm.name} needs at least "
                        f"{needed} samples per task (got {self.root.trainer.group_size})",
                    )
                ],
                str(resolved.source) if resolved.source else None,
            )

    def run(self, *, show_progress: bool = True, quiet: bool = False) -> TrainResult:
        """Train to `trainer.steps`, resuming from the latest checkpoint when allowed."""
        root, trainer = self.root, self.root.trainer
        torch.manual_seed(root.run.seed)
        random.seed(root.run.seed)
        resume = latest_checkpoint(self.output_dir) if trainer.resume else None
        model, tokenizer = load_configured_model(root.model, resume or self.start_model)
        algorithm = self.components.algorithm
        reference = None
        if algorithm.needs.reference:
            reference, _ = load_configured_model(root.model, self.start_model)
        critic = load_critic(algorithm.needs.critic, model, root.model, self.start_model)
        learner = Learner(
            model, algorithm, self._learner_settings(model), reference=reference, critic=critic
        )
        history, first_step, saved = restore_learner(learner, resume)
        staleness = trainer.max_staleness
        # stale rollouts play on their own copy of the weights while the learner trains its own
        rollout_model = copy.deepcopy(learner.unwrapped) if staleness else learner.unwrapped
        policy = self.components.policy_factory(rollout_model, tokenizer)
        engine = RolloutEngine(
            self.components.env_factory,
            policy,
            ChatFormat(tokenizer, model.generation_config),
            env_threads=root.rollout.env_threads,
        )
        train_tasks = evaluation_tasks(self.components.env_factory, "train", None)
        progress = stage_progress(root, first_step, show=show_progress, quiet=quiet)
        checkpoint = resume or self.start_model
        ahead = None
        if staleness:
            ahead = RolloutsAhead(
                self._player(engine, train_tasks, rollout_model, policy, resume),
                learner,
                staleness=staleness,
                steps=trainer.steps,
            )
            ahead.restore(saved.get("ahead", []))
        try:
            for step in range(first_step, trainer.steps):
                if ahead is None:
                    metrics, batch = self._healthy_rollout(
                        step, engine, train_tasks, history, checkpoint
                    )
                else:
                    metrics, batch = ahead.take(step, history)
                    self.host.after_rollout(step, batch, metrics)
                self._learn(metrics, batch, learner, policy if ahead is None else None)
                history.append(metrics)
                self.host.after_update(step, metrics)
                progress.update(step + 1, metrics)
                done = step + 1
                every = trainer.checkpoint_every
                if (every and done % every == 0) or done == trainer.steps:
                    checkpoint = save_learner_checkpoint(
                        self.output_dir,
                        done,
                        learner,
                        tokenizer=tokenizer,
                        history=history,
                        keep=trainer.keep_checkpoints,
                        extra={"ahead": ahead.settle()} if ahead else None,
                    )
                    self.host.on_checkpoint(done, checkpoint)
                if trainer.eval_every and done % trainer.eval_every == 0:
                    if ahead is not None:  # evaluate the learner's weights, not a stale copy
                        ahead.settle()
                        rollout_model.load_state_dict(learner.unwrapped.state_dict())
                        policy.sync_weights(rollout_model)
                    self._evaluate(done, engine, history)
        finally:
            progress.close()
            if ahead is not None:
                ahead.close()
            engine.close()
            policy.close()
        return TrainResult(Path(checkpoint), history, first_step)

    def _player(
        self,
        engine: RolloutEngine,
        train_tasks: list[int],
        rollout_model: Any,
        policy: Any,
        resume: Path | None,
    ) -> ThreadPlayer | ProcessPlayer:
        """Where rollouts ahead of the learner play (`trainer.rollout_worker`)."""
        if self.root.trainer.rollout_worker == "process":
            threads = max(1, torch.get_num_threads() // 2)
            return ProcessPlayer(self.resolved.raw, str(resume or self.start_model), threads)
        return ThreadPlayer(
            lambda step, seen: self._healthy_rollout(
                step, engine, train_tasks, seen, None, announce=False
            ),
            rollout_model,
            policy.sync_weights,
        )

    def _learner_settings(self, model: Any) -> LearnerSettings:
        trainer = self.root.trainer
        return LearnerSettings(
            lr=trainer.lr,
            lr_schedule=trainer.lr_schedule,
            warmup_steps=trainer.warmup_steps,
            total_steps=trainer.steps,
            weight_decay=trainer.weight_decay,
            epochs=trainer.epochs,
            mini_batches=trainer.mini_batches,
            micro_batch_tokens=trainer.micro_batch_tokens,
            row_tokens=trainer.row_tokens,
            share_rows=share_rows(trainer.packing, model),
            max_grad_norm=trainer.max_grad_norm,
            temperature=self.root.rollout.temperature,
            seed=self.root.run.seed,
            importance_cap=trainer.importance_cap if trainer.max_staleness else None,
        )

    def _rollout(
        self, step: int, engine: RolloutEngine, train_tasks: list[int], history: list
    ) -> tuple[dict[str, float], TrajectoryBatch]:
        """Play the update's episodes: tasks and sampling seeds follow from (run.seed, step)."""
        trainer = self.root.trainer
        seed = step_seed(self.root.run.seed, step)
        horizon = self.components.scheduler.max_turns(step, history)
        tasks = sample_tasks(train_tasks, trainer.tasks_per_step, seed)
        episodes = [
            EpisodeSpec(task_id=task, group=index, sample=sample)
            for index, task in enumerate(tasks)
            for sample in range(trainer.group_size)
        ]
        start = time.perf_counter()
        mine = engine.run(
            distributed.shard(episodes), rollout_settings(self.root, max_turns=horizon, seed=seed)
        )
        batch = TrajectoryBatch(distributed.gather(mine))
        metrics = rollout_metrics(batch, horizon=horizon, seconds=time.perf_counter() - start)
        metrics["step_seconds"] = time.perf_counter() - start
        return metrics, batch

    def _healthy_rollout(
        self,
        step: int,
        engine: RolloutEngine,
        train_tasks: list[int],
        history: list,
        checkpoint: Any,
        *,
        announce: bool = True,
    ) -> tuple[dict[str, float], TrajectoryBatch]:
        """The update's rollout; during an env outage, wait for the env and play it again.

        `announce`: call the `after_rollout` hook (the caller does, when False).

        An update whose episodes ended in env_error for `trainer.outage_fraction`
        of them or more is not trained on: the env is probed until it answers
        (up to `rollout.env_recovery_s`), then the same episodes are played
        again. Past that time the run stops; nothing was written for the update.
        """
        deadline = None
        while True:
            metrics, batch = self._rollout(step, engine, train_tasks, history)
            failed = recovery.env_errors(batch.trajectories)
            if not recovery.is_outage(len(failed), len(batch), self.root.trainer.outage_fraction):
                if announce:
                    self.host.after_rollout(step, batch, metrics)
                return metrics, batch
            recovery_s = self.root.rollout.env_recovery_s
            deadline = deadline or time.monotonic() + recovery_s
            self._say(
                f"update {step + 1}: {len(failed)} of {len(batch)} episodes ended in env_error "
                f"(last: {recovery.last_error(failed)}); not training on it. Waiting up to "
                f"{recovery_s:g} s (rollout.env_recovery_s) for env {self.root.env.name!r}."
            )
            if not recovery.wait_for_env(
                self.components.env_factory,
                list(dict.fromkeys(t.task_id for t in batch)),
                deadline=deadline,
                timeout_s=self.root.rollout.env_timeout_s,
                say=self._say,
            ):
                newest = checkpoint or latest_checkpoint(self.output_dir) or self.start_model
                raise environment_down(self.root, step, batch, newest)
            self._say(f"update {step + 1}: playing its episodes again")

    @staticmethod
    def _say(text: str) -> None:
        if distributed.is_main():
            print(f"agentgym: {text}", flush=True)

    def _learn(
        self,
        metrics: dict[str, float],
        batch: TrajectoryBatch,
        learner: Learner,
        policy: Any | None,
    ) -> None:
        """Advantages, the update, the policy's new weights; adds the learner's metrics.

        `policy` None: rollouts run ahead and take their weights themselves.
        """
        start = time.perf_counter()
        learner.score(batch.trainable)  # reference log-probs and critic values, where needed
        self.components.algorithm.advantages(batch)
        metrics.update({f"train/{k}": v for k, v in learner.update(batch).items()})
        if policy is not None:
            policy.sync_weights(learner.unwrapped)
        metrics["step_seconds"] += time.perf_counter() - start

    def _evaluate(
        self, step: int, engine: RolloutEngine, history: list[dict[str, float]]
    ) -> dict[str, float]:
        settings = eval_settings(self.root, self.components, steps=step, history=history)
        tasks = evaluation_tasks(self.components.env_factory, settings.split, settings.num_tasks)
        rollout = rollout_settings(self.root, max_turns=settings.max_turns, seed=self.root.run.seed)
        metrics, _ = run_evaluation(engine, tasks, settings, rollout)
        self.host.after_evaluation(step, settings.split, metrics)
        return metrics


def environment_down(
    root: Any, step: int, batch: TrajectoryBatch, checkpoint: Any
) -> EnvironmentDown:
    """The error for an outage longer than `rollout.env_recovery_s`: the update, env, weights."""
    failed = recovery.env_errors(batch.trajectories)
    waited = root.rollout.env_recovery_s
    return EnvironmentDown(
        f"update {step + 1}: {len(failed)} of {len(batch)} episodes ended in env_error and env "
        f"{root.env.name!r} did not answer within rollout.env_recovery_s={waited:g} s; "
        f"last error: {recovery.last_error(failed)}. Nothing was trained on in this update and no "
        f"checkpoint was written for it. Fix the environment and run again: the run resumes "
        f"from the newest weights, {checkpoint}."
    )


def share_rows(packing: str, model: Any) -> bool:
    """Whether trajectories share packed rows (`trainer.packing`; auto: with flash attention)."""
    if packing != "auto":
        return packing == "shared"
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None) or ""
    return attention.startswith("flash_attention")


def check_trainable(resolved: Any) -> None:
    """A train stage needs an algorithm, a scheduler and a token-level policy; say what is wrong."""
    problems = [
        Problem(block, f"a train stage needs `{block}: {{name: ...}}`")
        for block in ("algorithm", "scheduler")
        if getattr(resolved.root, block) is None
    ]
    if is_text_level(resolved.components["policy"][0].factory):
        problems.append(
            Problem(
                "policy.name",
                f"policy {resolved.root.policy.name!r} is text-level (a chat API returns text, "
                "not sampled token ids and log-probabilities): it can evaluate, not train; "
                "train with a token-level policy such as `hf` or `vllm`",
            )
        )
    if problems:
        raise ConfigError(problems, str(resolved.source) if resolved.source else None)


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
        env_error_retries=block.env_error_retries,
        env_recovery_s=root.rollout.env_recovery_s,
    )
