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
from agentgym_core.run.evaluate import evaluation_tasks
from agentgym_core.run.metrics import rollout_metrics
from agentgym_core.run.runtime import share_prompts, share_rows
from agentgym_core.tracking.console import EpisodeProgress
from agentgym_core.types import Trajectory, TrajectoryBatch

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
    """Plays update `step`'s episodes; during an env outage, waits and plays them again.

    An update whose episodes ended in env_error for `trainer.outage_fraction`
    of them or more is not trained on: the env is probed until it answers (up
    to `rollout.env_recovery_s`), then the same episodes are played again.
    Past that time the run stops (`EnvironmentDown`), naming `newest()`, the
    weights a rerun resumes from; nothing was written for the update.
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
        deadline = None
        while True:
            metrics, batch = self.play(step, history)
            failed = recovery.env_errors(batch.trajectories)
            if not recovery.is_outage(len(failed), len(batch), self.root.trainer.outage_fraction):
                if self.recompute_with is not None:
                    recompute_behaviour(self.recompute_with, batch, self.root)
                return metrics, batch
            recovery_s = self.root.rollout.env_recovery_s
            deadline = deadline or time.monotonic() + recovery_s
            say(
                f"update {step + 1}: {len(failed)} of {len(batch)} episodes ended in env_error "
                f"(last: {recovery.last_error(failed)}); not training on it. Waiting up to "
                f"{recovery_s:g} s (rollout.env_recovery_s) for env {self.root.env.name!r}."
            )
            if not recovery.wait_for_env(
                self.components.env_factory,
                list(dict.fromkeys(t.task_id for t in batch)),
                deadline=deadline,
                timeout_s=self.root.rollout.env_timeout_s,
                say=say,
            ):
                raise environment_down(self.root, step, batch, self.newest())
            say(f"update {step + 1}: playing its episodes again")

    def play(self, step: int, history: list[dict[str, float]]) -> Played:
        """Play the update's episodes once (tasks and seeds follow from run.seed and step)."""
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
        shard = distributed.shard(episodes)
        settings = rollout_settings(self.root, max_turns=horizon, seed=seed)
        progress = None
        if distributed.is_main():  # a real model's update plays for minutes
            progress = EpisodeProgress(len(shard), f"update {step + 1}", every_s=60.0)
        played = self.engine.run(shard, settings, progress, progress.turn if progress else None)
        mine, replayed = replay_env_errors(self.engine, shard, played, settings)
        batch = TrajectoryBatch(distributed.gather(mine))
        metrics = rollout_metrics(batch, horizon=horizon, seconds=time.perf_counter() - start)
        metrics["rollout/env_errors_replayed"] = float(sum(distributed.gather([replayed])))
        metrics.update(self.engine.pool.counters())
        metrics.update(policy_counters(self.engine.policy))
        metrics["step_seconds"] = time.perf_counter() - start
        return metrics, batch


def policy_counters(policy: Any) -> dict[str, float]:
    """A policy's optional `counters()` as `policy/<name>`; empty for policies without one.

    Cumulative numbers, such as a server policy's turns moved off a dead replica.
    """
    counters = getattr(policy, "counters", None)
    if not callable(counters):
        return {}
    return {f"policy/{key}": float(value) for key, value in counters().items()}


def replay_env_errors(
    engine: RolloutEngine,
    episodes: list[EpisodeSpec],
    played: list[Trajectory],
    settings: RolloutSettings,
) -> tuple[list[Trajectory], int]:
    """Play once more the episodes that ended in env_error (same task, group, sample, seed).

    An env server lost mid-episode then costs the update nothing when another
    answers: its episodes start again from reset elsewhere. When every episode
    failed, nothing is replayed here: that is an outage, which `RolloutStep`
    waits out. Returns the trajectories, replays in place, and how many were replayed.
    """
    failed = [i for i, t in enumerate(played) if recovery.is_env_error(t)]
    if not failed or len(failed) == len(played):
        return played, 0
    again = engine.run([episodes[i] for i in failed], settings)
    out = list(played)
    for index, trajectory in zip(failed, again, strict=True):
        out[index] = trajectory
    return out, len(failed)


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
    """Set each trainable trajectory's `logprobs` to `model`'s, in one packed pass.

    A sampler's log-probabilities vary in their last bits with which requests
    shared a batch, which depends on timing; this pass depends only on the
    batch, so a resumed run weighs its stale batches exactly as the first run
    did. It is part of playing the rollout: the trajectory leaves the source
    with these values, and nothing changes them later.
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
                trajectories[index].logprobs = values
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
        f"{root.env.name!r} did not answer within rollout.env_recovery_s={waited:g} s; "
        f"last error: {recovery.last_error(failed)}. Nothing was trained on in this update and no "
        f"checkpoint was written for it. Fix the environment and run again: the run resumes "
        f"from the newest weights, {checkpoint}."
    )
