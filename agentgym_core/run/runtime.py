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
from typing import TYPE_CHECKING, Any

import torch

from agentgym_core import distributed
from agentgym_core.config.errors import ConfigError, Problem
from agentgym_core.learner import lora
from agentgym_core.learner.forward import attention_implementation
from agentgym_core.learner.learner import Learner
from agentgym_core.learner.offpolicy import OffPolicySettings
from agentgym_core.learner.settings import LearnerSettings
from agentgym_core.plugins import PluginHost
from agentgym_core.run.checkpoint import (
    latest_checkpoint,
    restore_learner,
    save_learner_checkpoint,
)
from agentgym_core.run.components import (
    check_context_fits,
    check_top_layers,
    load_configured_model,
    load_critic,
)

if TYPE_CHECKING:
    from agentgym_core.tracking.console import ProgressBar


def learner_settings(root: Any, model: Any, *, offline: bool = False) -> LearnerSettings:
    """The learner's settings from the `trainer` (and `rollout`, `run`) blocks: the one mapping.

    `offline`: for an offline stage (SFT, DPO), whose `packing: auto` keeps shared rows.
    """
    trainer = root.trainer
    rows = offline_share_rows(trainer.packing) if offline else share_rows(trainer.packing, model)
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
        logprob_chunk_tokens=trainer.logprob_chunk_tokens or None,
        share_rows=rows,
        share_prompts=False if offline else share_prompts(trainer.share_prompts, model, rows),
        max_grad_norm=trainer.max_grad_norm,
        temperature=root.rollout.temperature,
        seed=root.run.seed,
        off_policy=OffPolicySettings(
            max_staleness=trainer.max_staleness,
            importance_cap=trainer.importance_cap,
            importance_mode=trainer.importance_mode,
        ),
    )


ROW_SHARING_ATTENTION = ("flash_attention", "flex_attention")
"""Kernels (name prefixes) under which `trainer.packing: auto` shares rows: they skip the
attention between a row's trajectories (flash's variable-length kernels, flex's block
mask), so a shared row costs what its trajectories would alone, without their padding.

Shared rows are correct under every kernel: their position ids restart at 0 for each
trajectory, and transformers builds the block-diagonal mask from them (`masking_utils.
find_packed_sequence_indices`, for a forward pass with no attention mask and no cache).
Under sdpa and eager that mask is dense: SDPA loses its fused causal kernel and computes
every pair of a row's tokens, so `auto` keeps one trajectory per row there (faster on the
CPU: benchmarks/README.md, learner_overhead.py)."""


def share_rows(packing: str, model: Any) -> bool:
    """Whether trajectories share packed rows (`trainer.packing`; auto: `ROW_SHARING_ATTENTION`)."""
    if packing != "auto":
        return packing == "shared"
    return attention_implementation(model).startswith(ROW_SHARING_ATTENTION)


def share_prompts(setting: bool | str, model: Any, rows_shared: bool) -> bool:
    """`trainer.share_prompts`; auto: on where it is supported.

    That is one process, one trajectory per row and attention that takes a key mask.
    """
    attention = attention_implementation(model)
    blocker = (
        f"the model's attention ({attention or 'unknown'}) takes no key mask: use "
        "model.attn_implementation sdpa or eager"
        if attention not in ("sdpa", "sdpa_gqa", "eager")
        else "rows are shared (trainer.packing): use trainer.packing padded"
        if rows_shared
        else "training runs in several processes (not supported yet)"
        if distributed.world_size() > 1
        else None
    )
    if setting == "auto":
        return blocker is None
    if setting and blocker:
        raise ConfigError([Problem("trainer.share_prompts", f"{blocker}, or set it false")])
    return bool(setting)


def offline_share_rows(packing: str) -> bool:
    """`trainer.packing` of an offline stage: `auto` keeps the shared rows it always used.

    An offline micro-batch is a group of whole examples in one forward pass;
    `padded` gives each sequence its own row instead.
    """
    return packing != "padded"


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


def load_training_model(
    model_block: Any, start_model: Path, resume: Path | None
) -> tuple[Any, Any]:
    """The model a stage trains: the resumed checkpoint's weights, else the start model's.

    With `model.lora`, the start model's weights under an adapter: a fresh one,
    or the resumed checkpoint's.
    """
    if model_block.lora is None:
        return load_configured_model(model_block, resume or start_model)
    base, tokenizer = load_configured_model(model_block, start_model)
    check_top_layers(base, model_block.lora.top_layers, start_model)
    model = lora.add_adapter(base, model_block.lora, base_path=start_model)
    if resume is not None:
        lora.load_adapter_weights(model, resume)
    return model, tokenizer


def open_learner(root: Any, algorithm: Any, start_model: Path, output_dir: Path) -> Opened:
    """Seed, resume, load, build the learner (with reference and critic if asked), restore.

    The reference is the start model: a copy of it, or with LoRA the same model
    with its adapter off.
    """
    torch.manual_seed(root.run.seed)
    random.seed(root.run.seed)
    resume = latest_checkpoint(output_dir) if root.trainer.resume else None
    model, tokenizer = load_training_model(root.model, start_model, resume)
    check_context_fits(model, root.rollout.max_context_tokens, start_model)
    reference = None
    if algorithm.needs.reference and lora.is_adapter(model):
        reference = lora.AdapterOff(model)
    elif algorithm.needs.reference:
        reference, _ = load_configured_model(root.model, start_model)
    critic = load_critic(getattr(algorithm.needs, "critic", None), model, root.model, start_model)
    settings = learner_settings(root, model, offline=not algorithm.needs.online)
    learner = Learner(model, algorithm, settings, reference=reference, critic=critic)
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
    from agentgym_core.tracking.console import ProgressBar  # late: a learner alone needs none

    main = distributed.is_main()
    return ProgressBar(
        root.trainer.steps,
        first_step,
        enabled=show and main,
        lines=not quiet and main,
        label=root.run.name,
    )
