"""Evaluation: play a split k times per task and report success, reward, Avg@k and Pass@k.

An evaluation is complete or says loudly that it is not: episodes that end in
env_error are played again (same task, same seed) once the environment
answers, up to `eval.env_error_retries` times; what still fails is counted,
and the metrics carry `partial: 1.0`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from agentgym_core import distributed
from agentgym_core.evaluation.metrics import summarize
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.rollout.engine import EpisodeSpec, RolloutEngine, RolloutSettings
from agentgym_core.rollout.text import TextRolloutEngine
from agentgym_core.run import recovery
from agentgym_core.tracking.console import EpisodeProgress
from agentgym_core.types import Trajectory


@dataclass(frozen=True)
class EvalSettings:
    """What to evaluate and how to sample."""

    split: str = "test"
    num_tasks: int | None = None
    k: int = 1
    max_turns: int = 10
    greedy: bool = False
    temperature: float = 1.0
    seed: int = 0
    env_error_retries: int = 3
    env_recovery_s: float = 300.0
    constrained: bool | None = None  # None: as the rollout settings say
    progress: bool = True
    """A line of episodes done and success so far, at most every 30 s (on stderr)."""


def evaluation_tasks(env_factory: Any, split: str, num_tasks: int | None) -> list[int]:
    """The first `num_tasks` ids of a split (all of it when None)."""
    env = env_factory()
    try:
        tasks = list(env.tasks(split))
    finally:
        env.close()
    return tasks if num_tasks is None else tasks[:num_tasks]


EVALUATION_OVERRIDES = frozenset({"max_turns", "temperature", "greedy", "constrained", "seed"})
"""The rollout settings an evaluation sets itself; it carries every other one from training."""


def evaluation_play(settings: EvalSettings, rollout: RolloutSettings) -> RolloutSettings:
    """Training's rollout settings with the evaluation's own `EVALUATION_OVERRIDES`.

    Derived with `dataclasses.replace`, not copied field by field: a new rollout option
    then reaches evaluations without anyone remembering to copy it.
    """
    constrained = rollout.constrained if settings.constrained is None else settings.constrained
    return dataclasses.replace(
        rollout,
        max_turns=settings.max_turns,
        temperature=settings.temperature,
        greedy=settings.greedy,
        constrained=constrained,
        seed=settings.seed + 7_919,
    )


def run_evaluation(
    engine: RolloutEngine,
    tasks: list[int],
    settings: EvalSettings,
    rollout: RolloutSettings,
) -> tuple[dict[str, float], list[Trajectory]]:
    """Play every task `k` times; returns the summary metrics and the trajectories.

    Under `accelerate launch` each rank plays its share of the episodes and
    every rank gets all of them (per-request seeds: the same episodes as one process).
    """
    episodes = [
        EpisodeSpec(task_id=task, group=index, sample=sample)
        for index, task in enumerate(tasks)
        for sample in range(settings.k)
    ]
    play = evaluation_play(settings, rollout)
    mine = distributed.shard(episodes)
    show = settings.progress and distributed.is_main()
    progress = EpisodeProgress(len(mine), "eval") if show else None
    trajectories = distributed.gather(
        engine.run(mine, play, progress, progress.turn if progress else None)
    )
    trajectories = _replay_env_errors(engine, episodes, trajectories, settings, play)
    metrics = summarize(trajectories, settings.k)
    metrics["partial"] = float(bool(recovery.env_errors(trajectories)))
    return metrics, trajectories


def _replay_env_errors(
    engine: RolloutEngine,
    episodes: list[EpisodeSpec],
    trajectories: list[Trajectory],
    settings: EvalSettings,
    play: RolloutSettings,
) -> list[Trajectory]:
    """Play env_error episodes again once the env answers; the rest stay as they were."""
    trajectories = list(trajectories)
    deadline = time.monotonic() + settings.env_recovery_s
    for attempt in range(1, settings.env_error_retries + 1):
        failed = [i for i, t in enumerate(trajectories) if recovery.is_env_error(t)]
        if not failed:
            break
        last = recovery.last_error([trajectories[i] for i in failed])
        _say(
            f"evaluation: {len(failed)} of {len(trajectories)} episodes ended in env_error "
            f"(last: {last}); retry {attempt} of {settings.env_error_retries} once the env answers"
        )
        answered = recovery.wait_for_env(
            engine.env_factory,
            list(dict.fromkeys(episodes[i].task_id for i in failed)),
            deadline=deadline,
            timeout_s=play.env_timeout_s,
            say=_say,
        )
        if not answered:
            break
        again = distributed.gather(
            engine.run(distributed.shard([episodes[i] for i in failed]), play)
        )
        for index, trajectory in zip(failed, again, strict=True):
            trajectories[index] = trajectory
    return trajectories


def _say(text: str) -> None:
    if distributed.is_main():
        print(f"agentgym: {text}", flush=True)


def partial_note(metrics: dict[str, float], trajectories: list[Trajectory]) -> str:
    """The loud line for a partial evaluation ('' when it is complete)."""
    if not metrics.get("partial"):
        return ""
    failed = recovery.env_errors(trajectories)
    return (
        f"PARTIAL EVALUATION: {len(failed)} of {len(trajectories)} episodes still ended in "
        f"env_error after eval.env_error_retries; last error: {recovery.last_error(failed)}. "
        f"The metrics above count only the other {len(trajectories) - len(failed)}."
    )


def evaluate_model(
    model: Any,
    tokenizer: Any,
    components: Any,
    settings: EvalSettings,
    rollout: RolloutSettings,
    *,
    env_threads: int = 8,
) -> tuple[dict[str, float], list[Trajectory]]:
    """Evaluate a loaded model with a fresh engine (for `agentgym eval` and pipelines)."""
    policy = components.policy_factory(model, tokenizer)
    engine = RolloutEngine(
        components.env_factory,
        policy,
        ChatFormat(tokenizer, getattr(model, "generation_config", None)),
        env_threads=env_threads,
    )
    try:
        tasks = evaluation_tasks(components.env_factory, settings.split, settings.num_tasks)
        return run_evaluation(engine, tasks, settings, rollout)
    finally:
        engine.close()
        policy.close()


def evaluate_text_policy(
    components: Any,
    settings: EvalSettings,
    rollout: RolloutSettings,
    *,
    env_threads: int = 8,
) -> tuple[dict[str, float], list[Trajectory]]:
    """Evaluate a text-level policy (a chat API): no model is loaded, see `rollout.text`."""
    policy = components.policy_factory(None, None)
    engine = TextRolloutEngine(components.env_factory, policy, env_threads=env_threads)
    try:
        tasks = evaluation_tasks(components.env_factory, settings.split, settings.num_tasks)
        return run_evaluation(engine, tasks, settings, rollout)
    finally:
        engine.close()
        policy.close()
