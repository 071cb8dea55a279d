"""Rollout sources: where an online stage's batches come from, and on which weights.

A source hands out finished batches (`take`), each tagged with the weight
version that sampled it (the number of updates those weights had seen), and
receives new weights when the stage pushes them after an update (`push`). It
never holds the learner. Three forms:

- `SyncRollouts` (`trainer.max_staleness: 0`): update t's rollout plays when
  asked, on the weights pushed after update t-1: rollout, then update, in turn.
- `AheadRollouts` on a thread (`max_staleness: k`, `rollout_worker: thread`):
  while the learner trains on update t, the rollouts of updates t+1 .. t+k
  already play on their own thread, each on the newest weights pushed when it
  started (a copy: the learner keeps training its own; a LoRA learner's frozen
  base is shared, not copied; a policy whose samplers hold their own weights,
  `vllm_server`, gets each version written for it at push instead, and no
  copy). Right where generation has its own device (a vLLM GPU).
- `AheadRollouts` in a process (`rollout_worker: process`, `rollout_process`):
  the same, in a child with its own interpreter, for CPUs where a thread would
  share the interpreter lock with the learner.

A batch is trained on at most k updates after the weights that sampled it
(`rollout/staleness`); the learner corrects for it (`learner.offpolicy`). A
rollout's tasks, horizon and seeds depend on its update number only
(`rollout_step`). A checkpoint waits for the rollouts in flight and keeps them
(`checkpoint_state`), so a resumed run trains on exactly the batches the
uninterrupted run would have. Ahead-of-learner rollouts need one process:
rollouts gathered across ranks would run collectives on two threads at once.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from agentgym_core import distributed
from agentgym_core.config.errors import ConfigError, Problem
from agentgym_core.rollout.engine import RolloutEngine
from agentgym_core.run.rollout_step import Played, RolloutStep, build_rollout_step
from agentgym_core.run.weights import Weights, load_weights, rollout_copy, snapshot
from agentgym_core.types import Trajectory, TrajectoryBatch


@dataclass
class Rollout:
    """One update's batch, its rollout metrics, and the weight version that sampled it."""

    metrics: dict[str, float]
    batch: TrajectoryBatch
    version: int


class RolloutSource(Protocol):
    """Where an online stage's batches come from."""

    def take(self, step: int, history: list[dict[str, float]]) -> Rollout:
        """Update `step`'s rollout (`history`: the metrics of every update before it)."""
        ...

    def push(self, model: Any, version: int) -> None:
        """The learner's weights after `version` updates; later rollouts play on them."""
        ...

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the source (waits for rollouts in flight)."""
        ...

    def evaluation_engine(self) -> RolloutEngine:
        """An engine whose policy holds the newest pushed weights, with nothing in flight."""
        ...

    def close(self) -> None:
        """Stop threads and processes; close the engine and the policy."""
        ...


class SyncRollouts:
    """Plays each update's rollout when asked, on the learner's own weights."""

    def __init__(self, play: RolloutStep, policy: Any, *, version: int) -> None:
        self.play, self.policy, self.version = play, policy, version

    def take(self, step: int, history: list[dict[str, float]]) -> Rollout:
        """Play update `step` now."""
        metrics, batch = self.play(step, history)
        return Rollout(metrics, batch, self.version)

    def push(self, model: Any, version: int) -> None:
        """Give the policy the new weights (free when it shares the learner's model)."""
        self.policy.sync_weights(model)
        self.version = version

    def checkpoint_state(self) -> dict[str, Any]:
        """Nothing is in flight."""
        return {}

    def evaluation_engine(self) -> RolloutEngine:
        """The rollout engine itself."""
        return self.play.engine

    def close(self) -> None:
        """Close the engine and the policy."""
        try:
            self.play.engine.close()
        finally:
            self.policy.close()


class ThreadPlayer:
    """Plays rollouts on a thread of this process, the policy loading each rollout's weights first.

    `load` gives the policy a version's weights: into the rollouts' copy of the
    model, then `sync_weights`; or, for a policy that stages them, `sync_staged`.
    """

    def __init__(self, play: Callable[[int, list], Played], load: Callable[[Any], None]) -> None:
        self.play, self.load = play, load

    def __call__(self, step: int, history: list, weights: Any, threads: int) -> Played:
        """Load `weights`, then play update `step`."""
        torch.set_num_threads(threads)
        self.load(weights)
        return self.play(step, history)

    def close(self) -> None:
        """Nothing to stop."""


@dataclass
class _InFlight:
    future: concurrent.futures.Future
    version: int


class AheadRollouts:
    """Keeps the rollouts of the next `staleness` updates playing while the learner trains.

    Args:
        player: plays one update on given weights (`ThreadPlayer`, `ProcessPlayer`).
        play: the parent's own `RolloutStep`, whose engine evaluations use.
        weights: what a version's weights are kept as, from the learner's model at `push`:
            a `snapshot`, or a policy's staged weights (`stage_weights`).
        load: gives the parent's policy such weights (before an evaluation).
        staleness: `trainer.max_staleness` (at least 1).
        steps: `trainer.steps` (no rollout is started past the last update).
        version: updates the starting weights have seen.
        start_weights: `model`'s weights as `weights` keeps them, when the policy already
            holds them (`synced_weights`); else they are kept from `model`.
    """

    def __init__(
        self,
        player: Any,
        play: RolloutStep,
        policy: Any,
        model: Any,
        *,
        weights: Callable[[Any], Any],
        load: Callable[[Any], None],
        staleness: int,
        steps: int,
        version: int,
        start_weights: Any = None,
    ) -> None:
        self.player, self.play, self.policy = player, play, policy
        self.keep, self.load = weights, load
        self.staleness, self.steps = staleness, steps
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollout-ahead")
        self.in_flight: dict[int, _InFlight] = {}
        self.weights = weights(model) if start_weights is None else start_weights
        self.version = version
        # the CPU's intra-op threads, split: torch's thread count is per calling thread, and two
        # threads each using every core would only take turns
        self.learner_threads = torch.get_num_threads()
        self.rollout_threads = max(1, self.learner_threads // 2)
        torch.set_num_threads(max(1, self.learner_threads - self.rollout_threads))

    def take(self, step: int, history: list[dict[str, float]]) -> Rollout:
        """Update `step`'s rollout; first starts those of the next updates on the newest weights."""
        for ahead in range(step, min(step + self.staleness, self.steps - 1) + 1):
            if ahead not in self.in_flight:
                seen = list(history)  # a horizon scheduler sees the updates finished by now
                future = self.pool.submit(
                    self.player, ahead, seen, self.weights, self.rollout_threads
                )
                self.in_flight[ahead] = _InFlight(future, self.version)
        flight = self.in_flight.pop(step)
        metrics, batch = flight.future.result()
        metrics["rollout/staleness"] = float(step - flight.version)
        return Rollout(metrics, batch, flight.version)

    def push(self, model: Any, version: int) -> None:
        """Keep the new weights: the next rollouts started play on them."""
        self.weights, self.version = self.keep(model), version

    def checkpoint_state(self) -> dict[str, Any]:
        """Wait for every rollout in flight; them as checkpoint data (see `restore`)."""
        out = []
        for step, flight in sorted(self.in_flight.items()):
            metrics, batch = flight.future.result()
            trajectories = [t.to_dict() for t in batch.trajectories]
            out.append(
                {"step": step, "version": flight.version, "metrics": metrics, "batch": trajectories}
            )
        return {"ahead": out}

    def restore(self, saved: list[dict[str, Any]]) -> None:
        """Put back the rollouts a checkpoint kept as in flight (finished)."""
        for entry in saved:
            future: concurrent.futures.Future = concurrent.futures.Future()
            batch = TrajectoryBatch([Trajectory.from_dict(t) for t in entry["batch"]])
            future.set_result((dict(entry["metrics"]), batch))
            self.in_flight[int(entry["step"])] = _InFlight(future, int(entry["version"]))

    def evaluation_engine(self) -> RolloutEngine:
        """Wait for the rollouts in flight, then give the policy the newest weights."""
        for flight in self.in_flight.values():
            flight.future.result()
        self.load(self.weights)
        return self.play.engine

    def close(self) -> None:
        """Wait for the rollout thread (a rollout in progress finishes first), then stop all."""
        try:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.player.close()
            torch.set_num_threads(self.learner_threads)
        finally:
            try:
                self.play.engine.close()
            finally:
                self.policy.close()


def staged_rollouts(root: Any, components: Any) -> bool:
    """Whether rollouts ahead of the learner skip the model copy: the policy stages weights.

    Its samplers (server replicas) hold their own weights, so the learner's model
    is only read when a version is pushed (the write is then on the learner's
    path, as in synchronous training). Not with a rollout process (it builds its
    own policy) or when the behaviour log-probabilities are recomputed (that pass
    needs the sampling version's model).
    """
    return (
        components.policy_stages_weights
        and root.trainer.rollout_worker == "thread"
        and root.trainer.behaviour_logprobs != "recomputed"
    )


def check_staleness(root: Any) -> list[Problem]:
    """Rollouts ahead of the learner need a single process."""
    if root.trainer.max_staleness and distributed.world_size() > 1:
        return [
            Problem(
                "trainer.max_staleness",
                "rollouts ahead of the learner need a single process "
                f"(this run has {distributed.world_size()}); set it to 0",
            )
        ]
    return []


def open_rollouts(
    resolved: Any,
    components: Any,
    model: Any,
    tokenizer: Any,
    *,
    version: int,
    saved: dict[str, Any],
    start_model: Path,
    weights_path: Path,
    newest: Callable[[], Path],
) -> RolloutSource:
    """The stage's rollout source, by `trainer.max_staleness` and `trainer.rollout_worker`.

    Args:
        resolved: the stage's resolved config.
        components: its env, policy and scheduler factories (`build_components`).
        model: the learner's model (synchronous rollouts share it; ahead ones copy it).
        version: updates `model` has seen.
        saved: the resumed checkpoint's extra state (rollouts kept in flight).
        start_model: the weights the stage started from.
        weights_path: the folder `model` was loaded from (a child process loads the same).
        newest: the weights an interrupted run would resume from (named in outage errors).
        tokenizer: the model's tokenizer.
    """
    root = resolved.root
    problems = check_staleness(root)
    if problems:
        raise ConfigError(problems, str(resolved.source) if resolved.source else None)
    trainer = root.trainer
    if not trainer.max_staleness:
        play, policy = build_rollout_step(root, components, model, tokenizer, newest)
        return SyncRollouts(play, policy, version=version)
    staged = staged_rollouts(root, components)
    # the learner keeps training its own model: the rollouts play a copy, or staged weights
    rollout_model = model if staged else rollout_copy(model)
    play, policy = build_rollout_step(root, components, rollout_model, tokenizer, newest)
    start_weights = None
    if staged:  # the samplers load each version from disk: nothing to copy
        keep, load = policy.stage_weights, policy.sync_staged
        start_weights = getattr(policy, "synced_weights", lambda: None)()
    else:
        keep = snapshot

        def load(weights: Weights) -> None:
            load_weights(rollout_model, weights)
            policy.sync_weights(rollout_model)

    player: Any = None
    try:
        if trainer.rollout_worker == "process":
            from agentgym_core.run.rollout_process import ProcessPlayer

            threads = max(1, torch.get_num_threads() // 2)
            player = ProcessPlayer(
                resolved.raw, str(start_model), str(weights_path), threads, newest=newest
            )
        else:
            player = ThreadPlayer(play, load)
        source = AheadRollouts(
            player,
            play,
            policy,
            rollout_model,
            weights=keep,
            load=load,
            staleness=trainer.max_staleness,
            steps=trainer.steps,
            version=version,
            start_weights=start_weights,
        )
    except BaseException:
        if player is not None:
            player.close()
        SyncRollouts(play, policy, version=version).close()  # its engine and policy
        raise
    try:
        source.restore(saved.get("ahead", []))
    except BaseException:
        source.close()
        raise
    return source
