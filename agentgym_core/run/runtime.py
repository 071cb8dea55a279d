"""What every training stage kind shares: its opening, its learner settings, its checkpoints.

The opening is one sequence, in one order (the RNG states of a resumed run
depend on it): seed, find the checkpoint to resume, load the model from it (or
the start model), load the frozen reference and the critic from the start
model, build the learner, and only then restore the checkpoint's optimizer,
schedule and RNG states, so that building the learner does not move them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentgym_core import distributed
from agentgym_core.learner.learner import Learner
from agentgym_core.learner.offpolicy import OffPolicySettings
from agentgym_core.learner.settings import LearnerSettings
from agentgym_core.plugins import PluginHost
from agentgym_core.run.checkpoint import (
    latest_checkpoint,
    restore_learner,
    save_learner_checkpoint,
)
from agentgym_core.run.components import load_configured_model, load_critic
from agentgym_core.tracking.console import ProgressBar


def learner_settings(root: Any, model: Any) -> LearnerSettings:
    """The learner's settings from the `trainer` (and `rollout`, `run`) blocks: the one mapping."""
    trainer = root.trainer
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
        temperature=root.rollout.temperature,
        seed=root.run.seed,
        off_policy=OffPolicySettings(
            max_staleness=trainer.max_staleness,
            importance_cap=trainer.importance_cap,
            importance_mode=trainer.importance_mode,
        ),
    )


def share_rows(packing: str, model: Any) -> bool:
    """Whether trajectories share packed rows (`trainer.packing`; auto: with flash attention)."""
    if packing != "auto":
        return packing == "shared"
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None) or ""
    return attention.startswith("flash_attention")


@dataclass
class Opened:
    """A stage's learner, ready to train, and where it stands."""

    learner: Learner
    tokenizer: Any
    history: list[dict[str, float]]
    first_step: int
    saved: dict[str, Any]
    """The resumed checkpoint's extra state (empty on a fresh start)."""
    weights: Path
    """The folder the learner's weights came from: the resumed checkpoint or the start model."""


def open_learner(root: Any, algorithm: Any, start_model: Path, output_dir: Path) -> Opened:
    """Seed, resume, load, build the learner (with reference and critic if asked), restore."""
    torch.manual_seed(root.run.seed)
    random.seed(root.run.seed)
    resume = latest_checkpoint(output_dir) if root.trainer.resume else None
    model, tokenizer = load_configured_model(root.model, resume or start_model)
    reference = None
    if algorithm.needs.reference:
        reference, _ = load_configured_model(root.model, start_model)
    critic = load_critic(getattr(algorithm.needs, "critic", None), model, root.model, start_model)
    learner = Learner(
        model, algorithm, learner_settings(root, model), reference=reference, critic=critic
    )
    history, first_step, saved = restore_learner(learner, resume)
    return Opened(learner, tokenizer, history, first_step, saved, Path(resume or start_model))


class Checkpoints:
    """Saves a stage's checkpoints when due (every `trainer.checkpoint_every` and at the end)."""

    def __init__(self, root: Any, output_dir: Path, host: PluginHost, latest: Path) -> None:
        self.trainer, self.output_dir, self.host = root.trainer, output_dir, host
        self.latest = latest
        """The newest weights: the last checkpoint saved, else where the stage started."""

    def due(self, done: int) -> bool:
        """Whether a checkpoint is due after `done` updates."""
        every = self.trainer.checkpoint_every
        return bool(every and done % every == 0) or done == self.trainer.steps

    def save(
        self,
        done: int,
        learner: Learner,
        tokenizer: Any,
        history: list[dict[str, float]],
        extra: dict[str, Any] | None = None,
    ) -> Path:
        """Write the checkpoint of `done` updates and tell the hooks; returns its folder."""
        self.latest = save_learner_checkpoint(
            self.output_dir,
            done,
            learner,
            tokenizer=tokenizer,
            history=history,
            keep=self.trainer.keep_checkpoints,
            extra=extra,
        )
        self.host.on_checkpoint(done, self.latest)
        return self.latest


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
