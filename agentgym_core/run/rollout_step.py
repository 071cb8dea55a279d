"""One update's rollout: its tasks, sampling seeds and horizon, played through env outages.

Every random choice of update t derives from (run.seed, t), so the same update
plays the same episodes wherever it plays: synchronously, on a thread ahead of
the learner, or in a child process (`sources`). Under `accelerate launch`
every rank draws the same tasks, plays its share of the episodes and gathers
everyone's; per-request sampling seeds make an episode's tokens independent
of which rank played it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentgym_core import distributed
from agentgym_core.learner.forward import token_logprobs
from agentgym_core.learner.packing import pack, unpack
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.rollout.engine import (
    EnvironmentDown,
    EpisodeSpec,
    RolloutEngine,
    RolloutSettings,
)
from agentgym_core.run import recovery
from agentgym_core.run.components import Components
from agentgym_core.run.evaluate import evaluation_tasks, on_every_rank
from agentgym_core.run.metrics import rollout_metrics
from agentgym_core.run.runtime import share_prompts, share_rows
from agentgym_core.tracking.console import EpisodeProgress
from agentgym_core.types import TrajectoryBatch

Played = tuple[dict[str, float], TrajectoryBatch]
"""An update's rollout metrics and its trajectories."""


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


def step_seed(run_seed: int, step: int) -> int:
    """Seed of everything random in update `step`."""
    return run_seed * 1_000_003 + step


def sample_tasks(train_tasks: list[int], count: int, seed: int) -> list[int]:
    """Tasks of one step, without replacement where possible."""
    rng = random.Random(seed)
    if count <= len(train_tasks):
        return rng.sample(train_tasks, count)
    return [rng.choice(train_tasks) for _ in range(count)]


def make_engine(components: Components, policy: Any, tokenizer: Any, model: Any, root: Any) -> Any:
    """A rollout engine over the config's env, for `policy` and the model's chat template."""
    return RolloutEngine(
        components.env_factory,
        policy,
        ChatFormat(tokenizer, model.generation_config),
        env_threads=root.rollout.env_threads,
    )


@dataclass
class RolloutStep:
    """Plays update `step`'s episodes, playing again those the environment lost.

    Episodes in env_error are played again by the same policy as evaluation's
    (`recovery.replay_env_errors`): at once while few failed, after the env
    answers when `trainer.outage_fraction` of them or more failed. An update
    still an outage after `rollout.env_error_retries` replays, or
    `rollout.env_recovery_s` of waiting, is not trained on: the run stops
    (`EnvironmentDown`), naming `newest()`, the weights a rerun resumes from;
    nothing was written for the update.
    """

    root: Any
    components: Components
    engine: RolloutEngine
    train_tasks: list[int]
    newest: Callable[[], Path]
    recompute_with: Any | None = None
    """A model holding the sampling weights: the batch's behaviour log-probabilities are its
    packed forward pass over the finished batch (`recompute_behaviour`), not the sampler's."""

    def __call__(self, step: int, history: list[dict[str, float]]) -> Played:
        """The update's metrics and batch, once enough of its episodes reached the env."""
        metrics, batch = self.play(step, history)
        failed = recovery.env_errors(batch.trajectories)
        if recovery.is_outage(len(failed), len(batch), self.root.trainer.outage_fraction):
            raise environment_down(self.root, step, batch, self.newest())
        if self.recompute_with is not None:
            recompute_behaviour(self.recompute_with, batch, self.root)
        return metrics, batch

    def play(self, step: int, history: list[dict[str, float]]) -> Played:
        """Play the update's episodes (tasks and seeds follow from run.seed and step)."""
        trainer = self.root.trainer
        seed = step_seed(self.root.run.seed, step)
        horizon = self.components.scheduler.max_turns(step, history)
        tasks = sample_tasks(self.train_tasks, trainer.tasks_per_step, seed)
        episodes = [
            EpisodeSpec(task_id=task, group=index, sample=sample)
            for index, task in enumerate(tasks)
            for sample in range(trainer.group_size)
        ]
        start = time.perf_counter()
        settings = rollout_settings(self.root, max_turns=horizon, seed=seed)
        run = on_every_rank(self.engine, settings)
        progress = None
        if distributed.is_main():  # a real model's update plays for minutes
            shard = distributed.shard(episodes)
            progress = EpisodeProgress(len(shard), f"update {step + 1}", every_s=60.0)
        trajectories, replayed = recovery.replay_env_errors(
            run,
            episodes,
            run(episodes, progress),
            replay_rules(self.root),
            self.components.env_factory,
            say=lambda text: say(f"update {step + 1}: {text}"),
        )
        batch = TrajectoryBatch(trajectories)
        metrics = rollout_metrics(batch, horizon=horizon, seconds=time.perf_counter() - start)
        metrics["rollout/env_errors_replayed"] = float(replayed)
        metrics.update(self.engine.pool.counters())
        metrics.update(policy_counters(self.engine.policy))
        metrics["step_seconds"] = time.perf_counter() - start
        return metrics, batch


def replay_rules(root: Any) -> recovery.ReplayRules:
    """Training's rules for episodes in env_error (evaluation's differ only in their retries)."""
    return recovery.ReplayRules(
        retries=root.rollout.env_error_retries,
        outage_fraction=root.trainer.outage_fraction,
        recovery_s=root.rollout.env_recovery_s,
        probe_timeout_s=root.rollout.env_timeout_s,
    )


def policy_counters(policy: Any) -> dict[str, float]:
    """A policy's optional `counters()` as `policy/<name>`; empty for policies without one.

    Cumulative numbers, such as a server policy's turns moved off a dead replica.
    """
    counters = getattr(policy, "counters", None)
    if not callable(counters):
        return {}
    return {f"policy/{key}": float(value) for key, value in counters().items()}


def build_rollout_step(
    root: Any, components: Components, model: Any, tokenizer: Any, newest: Callable[[], Path]
) -> tuple[RolloutStep, Any]:
    """A `RolloutStep` whose policy generates with `model`; returns it and the policy."""
    policy = components.policy_factory(model, tokenizer)
    engine = make_engine(components, policy, tokenizer, model, root)
    train_tasks = evaluation_tasks(components.env_factory, "train", None)
    step = RolloutStep(root, components, engine, train_tasks, newest)
    if recomputes_behaviour(root, policy):
        step.recompute_with = model
    return step, policy


def recomputes_behaviour(root: Any, policy: Any) -> bool:
    """Whether stale rollouts' behaviour log-probabilities are recomputed (`behaviour_logprobs`)."""
    mode = root.trainer.behaviour_logprobs
    if not root.trainer.max_staleness or mode == "sampler":
        return False
    return mode == "recomputed" or bool(getattr(policy, "computes_as_learner", False))


@torch.no_grad()
def recompute_behaviour(model: Any, batch: TrajectoryBatch, root: Any) -> None:
    """Set each trainable trajectory's `behaviour_logprobs` to `model`'s, in one packed pass.

    A sampler's log-probabilities vary in their last bits with which requests
    shared a batch, which depends on timing; this pass depends only on the
    batch, so a resumed run weighs its stale batches exactly as the first run
    did. It is part of playing the rollout: the trajectory leaves the source
    with these values beside its sampled `logprobs`, which stay as they were.
    """
    trajectories = batch.trainable
    if not trajectories:
        return
    trainer = root.trainer
    was_training = model.training
    model.eval()
    try:
        rows = share_rows(trainer.packing, model)
        for mb in pack(
            trajectories,
            row_tokens=trainer.row_tokens,
            micro_batch_tokens=trainer.micro_batch_tokens,
            share_rows=rows,
            share_prompts=share_prompts(trainer.share_prompts, model, rows),
        ):
            logprobs, _ = token_logprobs(
                model,
                mb,
                root.rollout.temperature,
                chunk_tokens=trainer.logprob_chunk_tokens or None,
            )
            for index, values in unpack(mb, logprobs, trajectories).items():
                trajectories[index].behaviour_logprobs = values
    finally:
        model.train(was_training)


def say(text: str) -> None:
    """A line on the console from the main process."""
    if distributed.is_main():
        print(f"agentgym: {text}", flush=True)


def environment_down(
    root: Any, step: int, batch: TrajectoryBatch, checkpoint: Any
) -> EnvironmentDown:
    """The error for an outage longer than `rollout.env_recovery_s`: the update, env, weights."""
    failed = recovery.env_errors(batch.trajectories)
    waited = root.rollout.env_recovery_s
    return EnvironmentDown(
        f"update {step + 1}: {len(failed)} of {len(batch)} episodes ended in env_error and env "
        f"{root.env.name!r} did not come back within rollout.env_recovery_s={waited:g} s "
        f"and rollout.env_error_retries={root.rollout.env_error_retries} replays; "
        f"last error: {recovery.last_error(failed)}. Nothing was trained on in this update and no "
        f"checkpoint was written for it. Fix the environment and run again: the run resumes "
        f"from the newest weights, {checkpoint}."
    )
