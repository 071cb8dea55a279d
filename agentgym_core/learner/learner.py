"""The learner: model and AdamW under accelerate, one update per batch of trajectories.

An update splits the trainable trajectories into mini-batches (one optimizer
step each, repeated for `epochs`), packs each mini-batch into micro-batches,
recomputes log-probabilities with the sampler's action constraints, and asks
the algorithm for the loss.
"""

from __future__ import annotations

import math
import random
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator

from agentgym_core.interfaces import Algorithm, LossInputs
from agentgym_core.learner.packing import MicroBatch, pack
from agentgym_core.policies.constraints import apply_allowed_mask
from agentgym_core.types import Trajectory, TrajectoryBatch


@dataclass(frozen=True)
class LearnerSettings:
    """Optimization settings (from the `trainer` config block)."""

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
    max_grad_norm: float | None = 1.0
    temperature: float = 1.0
    seed: int = 0


def token_logprobs(
    model: Any, batch: MicroBatch, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of the targets and the entropy, both [rows, width].

    Logits are divided by the sampling temperature and restricted to the
    sampler's allowed ids where decoding was constrained.
    """
    device = next(model.parameters()).device
    out = model(
        input_ids=batch.input_ids.to(device),
        position_ids=batch.position_ids.to(device),
        use_cache=False,
    )
    logits = out.logits.float() / temperature
    rows, width, vocab = logits.shape
    flat = logits.reshape(rows * width, vocab)
    if batch.constrained_at:
        index = [r * width + c for r, c in batch.constrained_at]
        flat = apply_allowed_mask(flat, index, batch.constrained_ids)
    logp = torch.log_softmax(flat, dim=-1)
    targets = batch.targets.to(device).reshape(-1, 1)
    chosen = logp.gather(1, targets).squeeze(1)
    finite = torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))
    entropy = -(logp.exp() * finite).sum(-1)
    return chosen.reshape(rows, width), entropy.reshape(rows, width)


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


class Learner:
    """Owns the trainable model, the optimizer and the optional frozen reference."""

    def __init__(
        self,
        model: Any,
        algorithm: Algorithm,
        settings: LearnerSettings,
        *,
        reference: Any | None = None,
        accelerator: Accelerator | None = None,
    ) -> None:
        self.settings = settings
        self.algorithm = algorithm
        self.accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=settings.lr,
            weight_decay=settings.weight_decay,
            betas=settings.betas,
        )
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda update: lr_factor(update, settings)
        )
        self.reference = reference
        if reference is not None:
            reference.eval().requires_grad_(False)
        self._shuffle = random.Random(settings.seed)
        self._on_policy = True
        self._drift, self._drift_tokens = 0.0, 0

    @property
    def unwrapped(self) -> Any:
        """The bare transformers model (for saving and for a shared policy)."""
        return self.accelerator.unwrap_model(self.model)

    def update(self, batch: TrajectoryBatch) -> dict[str, float]:
        """Run every optimizer step for one batch; returns token-weighted mean metrics."""
        start = time.perf_counter()
        trainable = [t for t in batch.trainable if t.advantages is not None]
        if not trainable:
            lr = self.scheduler.get_last_lr()[0]
            self.scheduler.step()  # the lr schedule counts updates, trained on or not
            return {"skipped": 1.0, "lr": lr}
        self.model.train()
        sums: dict[str, float] = defaultdict(float)
        weight = 0.0
        slots = real = 0
        steps = 0
        self._on_policy = self.settings.epochs == 1 and self.settings.mini_batches == 1
        self._drift, self._drift_tokens = 0.0, 0
        drift = None if self._on_policy else self._recompute_old_logprobs(trainable)
        for _ in range(self.settings.epochs):
            for mini in self._mini_batches(trainable):
                metrics, tokens, mb_slots, mb_real = self._optimizer_step(mini)
                for key, value in metrics.items():
                    sums[key] += value * tokens
                weight += tokens
                slots, real = slots + mb_slots, real + mb_real
                steps += 1
        result = {k: v / max(weight, 1.0) for k, v in sums.items()}
        if drift is None:
            drift = self._drift / max(self._drift_tokens, 1)
        result["sampler_logprob_diff"] = drift
        result["padding_fraction"] = 1.0 - real / max(slots, 1)
        result["optimizer_steps"] = float(steps)
        result["lr"] = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        result["update_seconds"] = time.perf_counter() - start
        return result

    def state(self) -> dict[str, Any]:
        """What a checkpoint needs beyond the weights and optimizer to continue exactly."""
        return {"shuffle": self._shuffle.getstate(), "scheduler": self.scheduler.state_dict()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of `state`."""
        self._shuffle.setstate(state["shuffle"])
        self.scheduler.load_state_dict(state["scheduler"])

    def _mini_batches(self, trajectories: list[Trajectory]) -> list[list[Trajectory]]:
        order = list(range(len(trajectories)))
        self._shuffle.shuffle(order)
        count = min(self.settings.mini_batches, len(order))
        return [[trajectories[i] for i in order[k::count]] for k in range(count)]

    def _optimizer_step(
        self, trajectories: list[Trajectory]
    ) -> tuple[dict[str, float], float, int, int]:
        micro_batches = pack(
            trajectories,
            row_tokens=self.settings.row_tokens,
            micro_batch_tokens=self.settings.micro_batch_tokens,
        )
        normalizer = float(sum(mb.num_masked for mb in micro_batches)) or 1.0
        sums: dict[str, float] = defaultdict(float)
        for mb in micro_batches:
            inputs = self._loss_inputs(mb, normalizer)
            loss, metrics = self.algorithm.loss(inputs)
            self.accelerator.backward(loss)
            share = mb.num_masked / normalizer
            sums["loss"] += float(loss.detach())
            for key, value in metrics.items():
                sums[key] += value * share
        grad_norm = self._clip_gradients()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        sums["grad_norm"] = float(grad_norm)
        slots = sum(mb.slots for mb in micro_batches)
        real = sum(mb.real_tokens for mb in micro_batches)
        return dict(sums), normalizer, slots, real

    def _clip_gradients(self) -> float:
        if self.settings.max_grad_norm is None:
            grads = [p.grad.norm() for p in self.model.parameters() if p.grad is not None]
            return float(torch.linalg.vector_norm(torch.stack(grads))) if grads else 0.0
        return float(
            self.accelerator.clip_grad_norm_(self.model.parameters(), self.settings.max_grad_norm)
        )

    @torch.no_grad()
    def _recompute_old_logprobs(self, trajectories: list[Trajectory]) -> float:
        """Replace the sampler's log-probabilities by the learner's; returns their mean |diff|.

        Several optimizer steps per batch need fixed "old" log-probabilities. The
        learner's own make the update a deterministic function of the sampled
        tokens (the sampler's vary in the last bits with how requests were batched).
        """
        diff, count = 0.0, 0
        self.model.eval()  # as the sampler ran: no dropout in the fixed "old" values
        for traj in trajectories:
            (mb,) = pack([traj], row_tokens=None, micro_batch_tokens=len(traj.token_ids))
            logprobs, _ = token_logprobs(self.model, mb, self.settings.temperature)
            mask = mb.mask[0].bool()
            fresh = torch.zeros(len(traj.token_ids))
            fresh[1:][mask[:-1]] = logprobs[0, :-1][mask[:-1]].float().cpu()
            diff += float((fresh[1:][mask[:-1]] - mb.old_logprobs[0, :-1][mask[:-1]]).abs().sum())
            count += int(mask.sum())
            traj.logprobs = fresh.tolist()
        self.model.train()
        return diff / max(count, 1)

    def _loss_inputs(self, mb: MicroBatch, normalizer: float) -> LossInputs:
        logprobs, entropy = token_logprobs(self.model, mb, self.settings.temperature)
        device = logprobs.device
        sampler = mb.old_logprobs.to(device)
        # One optimizer step per batch is exactly on-policy: the ratio's value is 1 and its
        # gradient that of log pi. Using the learner's own values keeps the update a
        # deterministic function of the tokens; the sampler's are only compared.
        old = logprobs.detach() if self._on_policy else sampler
        if self._on_policy:
            mask = mb.mask.to(device)
            self._drift += float(((old - sampler).abs() * mask).sum())
            self._drift_tokens += int(mask.sum())
        ref = None
        if self.reference is not None:
            with torch.no_grad():
                ref, _ = token_logprobs(self.reference, mb, self.settings.temperature)
        return LossInputs(
            logprobs=logprobs,
            old_logprobs=old,
            advantages=mb.advantages.to(device),
            mask=mb.mask.to(device),
            entropy=entropy,
            normalizer=normalizer,
            ref_logprobs=ref,
            returns=mb.returns.to(device),
        )
