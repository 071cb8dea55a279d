"""Evaluation: play a split k times per task and report success, reward, Avg@k and Pass@k.

An evaluation is complete or says loudly that it is not: episodes that end in
env_error are played again as in training (`recovery.replay_env_errors`, up to
`eval.env_error_retries` times); what still fails is counted, and the metrics
carry `partial: 1.0`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
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
    outage_fraction: float = 0.5
    """This share of episodes in env_error waits for the env before the first replay."""
    constrained: bool | None = None  # None: as the rollout settings say
    progress: bool = True
    """A line of episodes done and success so far, at most every 30 s (on stderr)."""


def error_retries(root: Any) -> int:
    """`eval.env_error_retries`, or training's when it is not set."""
    retries = root.eval.env_error_retries
    return root.rollout.env_error_retries if retries is None else retries


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
    show = settings.progress and distributed.is_main()
    progress = EpisodeProgress(len(distributed.shard(episodes)), "eval") if show else None
    run = on_every_rank(engine, play)
    rules = recovery.ReplayRules(
        retries=settings.env_error_retries,
        outage_fraction=settings.outage_fraction,
        recovery_s=settings.env_recovery_s,
        probe_timeout_s=play.env_timeout_s,
    )
    trajectories, _ = recovery.replay_env_errors(
        run, episodes, run(episodes, progress), rules, engine.env_factory, say=_say
    )
    metrics = summarize(trajectories, settings.k)
    metrics["partial"] = float(bool(recovery.env_errors(trajectories)))
    return metrics, trajectories


def on_every_rank(engine: Any, settings: RolloutSettings) -> Callable[..., list[Trajectory]]:
    """`run(specs, progress=None)`: each rank plays its share of `specs`, all get every one.

    The trajectories come back in the order of `specs` (`distributed.shard` is contiguous).
    """

    def run(specs: list[EpisodeSpec], shown: EpisodeProgress | None = None) -> list[Trajectory]:
        mine = distributed.shard(specs)
        return distributed.gather(engine.run(mine, settings, shown, shown.turn if shown else None))

    return run


def _say(text: str) -> None:
    if distributed.is_main():
        print(f"agentgym: evaluation: {text}", flush=True)


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
