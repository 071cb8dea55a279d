"""Rollouts in a child process (`trainer.rollout_worker: process`), for CPUs.

With tiny models most of a rollout is Python (the engine, the envs, sampling),
and a rollout thread shares the interpreter lock with the learner: on a CPU
they would take turns. A child process has its own interpreter, its own copy
of the model and its own envs; it gets the learner's weights with each request
and sends back the update's metrics and trajectories. It builds everything
from the stage's config (`spawn`: nothing of the parent is inherited), so the
env and policy must come from installed plugins.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentgym_core.numerics import flush_subnormals
from agentgym_core.types import Trajectory, TrajectoryBatch


def _pack(weights: dict[str, torch.Tensor]) -> bytes:
    buffer = io.BytesIO()
    torch.save(weights, buffer)
    return buffer.getvalue()


class ProcessPlayer:
    """Plays rollouts in a child process; callable like `sources.ThreadPlayer`.

    Args:
        raw: the stage's config as a plain dict (`ResolvedConfig.raw`).
        start_model: the weights the stage started from.
        model_path: the checkpoint the learner was loaded from (weights come per request).
        threads: torch's intra-op threads in the child.
        newest: the weights a rerun would resume from; an outage error in the child names them.
    """

    def __init__(
        self,
        raw: dict[str, Any],
        start_model: str,
        model_path: str,
        threads: int,
        *,
        newest: Callable[[], Path],
    ) -> None:
        self.newest = newest
        context = multiprocessing.get_context("spawn")
        self.connection, child = context.Pipe()
        self.process = context.Process(
            target=serve,
            args=(raw, start_model, model_path, threads, child),
            daemon=True,
            name="rollouts",
        )
        self.process.start()
        child.close()
        self._answer()  # "ready", or the child's error in building the stage

    def __call__(
        self, step: int, history: list[dict[str, float]], weights: dict, threads: int
    ) -> tuple[dict[str, float], TrajectoryBatch]:
        """Send the weights and the update number; wait for its rollout."""
        self.connection.send(("play", step, history, _pack(weights), str(self.newest())))
        metrics, trajectories = self._answer()
        return metrics, TrajectoryBatch([Trajectory.from_dict(t) for t in trajectories])

    def _answer(self) -> Any:
        try:
            kind, payload = self.connection.recv()
        except EOFError:
            raise RuntimeError(
                f"the rollout process died (exit code {self.process.exitcode})"
            ) from None
        if kind == "error":
            raise payload
        return payload

    def close(self) -> None:
        """Stop the child (it finishes nothing: no rollout is asked for at close)."""
        if self.process.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self.connection.send(("stop",))
            self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
        self.connection.close()


def serve(
    raw: dict[str, Any], start_model: str, model_path: str, threads: int, connection: Any
) -> None:
    """The child: build the stage's env, policy and engine, then play what is asked."""
    try:
        flush_subnormals()  # this process is agentgym's own (numerics.py)
        torch.set_num_threads(threads)
        play = _build(raw, start_model, model_path)
        connection.send(("ready", None))
    except BaseException as error:  # noqa: BLE001 - sent to the parent, which raises it
        connection.send(("error", _picklable(error)))
        return
    while True:
        message = connection.recv()
        if message[0] == "stop":
            return
        _, step, history, weights, newest = message
        try:
            metrics, batch = play(step, history, torch.load(io.BytesIO(weights)), Path(newest))
            connection.send(("ok", (metrics, [t.to_dict() for t in batch.trajectories])))
        except BaseException as error:  # noqa: BLE001 - e.g. EnvironmentDown, raised in the parent
            connection.send(("error", _picklable(error)))


def _build(raw: dict[str, Any], start_model: str, model_path: str) -> Any:
    from agentgym_core.config.resolve import validate_dict
    from agentgym_core.plugins import PluginHost
    from agentgym_core.run.components import build_components
    from agentgym_core.run.rollout_step import build_rollout_step
    from agentgym_core.run.runtime import load_training_model
    from agentgym_core.run.weights import load_weights

    resolved = validate_dict(raw, PluginHost().registry)
    root = resolved.root
    resume = None if model_path == start_model else Path(model_path)
    model, tokenizer = load_training_model(root.model, Path(start_model), resume)
    newest = [Path(model_path)]  # the parent's newest weights, as its last request named them
    rollout_step, policy = build_rollout_step(
        root, build_components(resolved), model, tokenizer, lambda: newest[0]
    )

    def play(
        step: int, history: list, weights: dict, parent_newest: Path
    ) -> tuple[dict, TrajectoryBatch]:
        newest[0] = parent_newest
        load_weights(model, weights)
        policy.sync_weights(model)
        return rollout_step(step, history)

    return play


def _picklable(error: BaseException) -> BaseException:
    """The error itself when it survives pickling, else a RuntimeError with its text."""
    import pickle

    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(error).__name__}: {error}")
