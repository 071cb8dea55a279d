"""Rollouts that run ahead of the learner by at most `trainer.max_staleness` updates.

With `max_staleness: k`, when the learner starts update t the rollouts of
updates t+1 .. t+k are already playing on their own thread, on the weights the
learner had when each was started (a copy: the learner keeps training its own).
So rollout and learning overlap, and a batch is trained on at most k updates
after the weights that sampled it; `rollout/staleness` records how many. The
learner corrects for it with decoupled PPO (`agentgym_core.learner.decoupled`).

A rollout's tasks, horizon and sampling seeds depend on its update number
only, as in the synchronous loop. A checkpoint waits for the rollouts in
flight and keeps them (`extra["ahead"]` of its state), so a resumed run
trains on exactly the batches the uninterrupted run would have.

On GPUs the same split gives generation its own device: the policy holds its
own copy of the weights (vLLM on a second GPU, say) and receives them at the
start of each rollout. One process only: rollouts gathered across ranks would
run collectives on two threads at once.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from agentgym_core.types import Trajectory, TrajectoryBatch

Play = Callable[[int, list[dict[str, float]]], tuple[dict[str, float], TrajectoryBatch]]
"""Plays update `step`'s rollout given the history so far: (metrics, batch)."""

Weights = dict[str, torch.Tensor]


class ThreadPlayer:
    """Plays rollouts in this process: the policy's own model copy gets each rollout's weights.

    Simple, and right where generation has its own device (a vLLM GPU). On a CPU the
    rollout shares the GIL with the learner; `ProcessPlayer` does not.
    """

    def __init__(self, play: Play, rollout_model: Any, sync: Callable[[Any], None]) -> None:
        self.play, self.rollout_model, self.sync = play, rollout_model, sync

    def __call__(
        self, step: int, history: list[dict[str, float]], weights: Weights, threads: int
    ) -> tuple[dict[str, float], TrajectoryBatch]:
        """Load `weights` into the policy's model, then play update `step`."""
        torch.set_num_threads(threads)
        self.rollout_model.load_state_dict(weights)
        self.sync(self.rollout_model)
        return self.play(step, history)

    def close(self) -> None:
        """Nothing to stop."""


@dataclass
class _InFlight:
    future: concurrent.futures.Future
    version: int
    """Updates the learner had done when this rollout's weights were taken."""


class RolloutsAhead:
    """Keeps the rollouts of the next `staleness` updates playing while the learner trains.

    Args:
        player: plays one update's rollout on given weights (`ThreadPlayer`, `ProcessPlayer`).
        learner: the learner whose weights each rollout starts from.
        staleness: `trainer.max_staleness` (at least 1).
        steps: `trainer.steps` (no rollout is started past the last update).
    """

    def __init__(self, player: Any, learner: Any, *, staleness: int, steps: int) -> None:
        self.player, self.learner = player, learner
        self.staleness, self.steps = staleness, steps
        self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollout-ahead")
        self.in_flight: dict[int, _InFlight] = {}
        # the CPU's intra-op threads, split: torch's thread count is per calling thread, and two
        # threads each using every core would only take turns
        self.learner_threads = torch.get_num_threads()
        self.rollout_threads = max(1, self.learner_threads // 2)
        torch.set_num_threads(max(1, self.learner_threads - self.rollout_threads))

    def take(self, step: int, history: list[dict[str, float]]) -> tuple[dict, TrajectoryBatch]:
        """Update `step`'s rollout; first starts those of the next updates on today's weights."""
        for ahead in range(step, min(step + self.staleness, self.steps - 1) + 1):
            if ahead not in self.in_flight:
                self._start(ahead, history, version=step)
        flight = self.in_flight.pop(step)
        metrics, batch = flight.future.result()
        metrics["rollout/staleness"] = float(step - flight.version)
        return metrics, batch

    def _start(self, step: int, history: list[dict[str, float]], *, version: int) -> None:
        weights = {k: v.detach().clone() for k, v in self.learner.unwrapped.state_dict().items()}
        seen = list(history)  # a horizon scheduler sees the updates finished by now

        future = self.pool.submit(self.player, step, seen, weights, self.rollout_threads)
        self.in_flight[step] = _InFlight(future, version)

    def settle(self) -> list[dict[str, Any]]:
        """Wait for every rollout in flight; them as checkpoint data (see `restore`)."""
        out = []
        for step, flight in sorted(self.in_flight.items()):
            metrics, batch = flight.future.result()
            trajectories = [t.to_dict() for t in batch.trajectories]
            out.append(
                {"step": step, "version": flight.version, "metrics": metrics, "batch": trajectories}
            )
        return out

    def restore(self, saved: list[dict[str, Any]]) -> None:
        """Put back the rollouts a checkpoint kept as in flight (finished)."""
        for entry in saved:
            future: concurrent.futures.Future = concurrent.futures.Future()
            batch = TrajectoryBatch([Trajectory.from_dict(t) for t in entry["batch"]])
            future.set_result((dict(entry["metrics"]), batch))
            self.in_flight[int(entry["step"])] = _InFlight(future, int(entry["version"]))

    def close(self) -> None:
        """Wait for the rollout thread (a rollout in progress finishes first); threads back."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.player.close()
        torch.set_num_threads(self.learner_threads)
