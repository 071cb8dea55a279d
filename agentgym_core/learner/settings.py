"""The learner's settings, its optimizer and its learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from agentgym_core.learner.offpolicy import OffPolicySettings


@dataclass(frozen=True)
class LearnerSettings:
    """Optimization settings (from the `trainer` config block, see `run.runtime`)."""

    lr: float = 1e-4
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int = 1
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    epochs: int = 1
    mini_batches: int = 1
    micro_batch_tokens: int = 8192
    row_tokens: int | None = None
    logprob_chunk_tokens: int | None = None
    """Agent tokens the output head runs on at a time (`head.scores_in_chunks`); None: all."""
    share_rows: bool = True
    share_prompts: bool = False
    """Lay out trajectories with the same prompt once per prompt (`packing.prompt_units`)."""
    max_grad_norm: float | None = 1.0
    temperature: float = 1.0
    seed: int = 0
    off_policy: OffPolicySettings = field(default_factory=OffPolicySettings)
    """Stale rollouts and their correction (`offpolicy`)."""

    @property
    def steps_per_batch(self) -> int:
        """Optimizer steps of one update."""
        return self.epochs * self.mini_batches


def lr_factor(update: int, settings: LearnerSettings) -> float:
    """Multiplier of the peak lr at update `update`: linear warmup, then constant/linear/cosine."""
    if update < settings.warmup_steps:
        return (update + 1) / settings.warmup_steps
    if settings.lr_schedule == "constant":
        return 1.0
    span = max(settings.total_steps - settings.warmup_steps, 1)
    progress = min((update - settings.warmup_steps) / span, 1.0)
    if settings.lr_schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def adamw(
    parameters: Iterable[torch.nn.Parameter], lr: float, settings: LearnerSettings
) -> torch.optim.Optimizer:
    """AdamW over the trainable ones of `parameters`, with the settings' decay and betas."""
    trainable = [p for p in parameters if p.requires_grad]
    return torch.optim.AdamW(
        trainable, lr=lr, weight_decay=settings.weight_decay, betas=settings.betas
    )


def lr_schedule(optimizer: Any, settings: LearnerSettings) -> torch.optim.lr_scheduler.LambdaLR:
    """Warmup then decay, stepped once per update (trained on or skipped)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda u: lr_factor(u, settings))
