"""The learner: model and AdamW under accelerate, one update per batch of trajectories.

Before the algorithm's `advantages`, `score` puts the frozen reference's
log-probabilities and the critic's values on the trajectories (when the
algorithm needs them). An update then splits the trainable trajectories into
mini-batches (one optimizer step each, repeated for `epochs`), packs each
mini-batch into micro-batches, recomputes log-probabilities with the sampler's
action constraints (and values, with a critic), and asks the algorithm for the loss.
"""

from __future__ import annotations

import functools
import inspect
import math
import random
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator

from agentgym_core.interfaces import Algorithm, CriticSpec, LossInputs
from agentgym_core.learner.critic import Critic, ValueHead, hidden_size, last_hidden_state
from agentgym_core.learner.packing import MicroBatch, pack, unpack
from agentgym_core.policies.constraints import allowed_mask
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
    """Log-probabilities of the targets and the entropy, both [rows, width], 0 off agent tokens.

    Logits are divided by the sampling temperature and restricted to the
    sampler's allowed ids where decoding was constrained.
    """
    logprobs, entropy, _ = policy_forward(model, batch, temperature)
    return logprobs, entropy


def policy_forward(
    model: Any,
    batch: MicroBatch,
    temperature: float,
    *,
    hidden: bool = False,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`token_logprobs`, plus the last hidden state [rows, width, hidden] when `hidden`.

    Only agent tokens (`batch.mask`) carry loss, and they are a small share of
    a multi-turn sequence, so the output projection, log-softmax and entropy run
    on their positions alone: the [tokens, vocab] logits of the whole batch are
    never built. `entropy_grad=False` computes the entropy as a metric only.
    """
    device = next(model.parameters()).device
    mask = batch.mask.to(device).bool()
    columns = mask.any(0).nonzero().squeeze(1)  # every column holding an agent token
    out = model(
        input_ids=batch.input_ids.to(device),
        position_ids=batch.position_ids.to(device),
        use_cache=False,
        output_hidden_states=hidden,
        **_logits_only_at(model, columns),
    )
    logits = out.logits if out.logits.shape[1] == columns.numel() else out.logits[:, columns]
    picked = logits[mask[:, columns]].float() / temperature  # [agent tokens, vocab], row-major
    if batch.constrained_at:
        picked = _constrain(picked, mask, batch)
    logp = torch.log_softmax(picked, dim=-1)
    chosen = logp.gather(1, batch.targets.to(device)[mask].unsqueeze(1)).squeeze(1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        finite = logp.masked_fill(~torch.isfinite(logp), 0.0)
        entropy = -(logp.exp() * finite).sum(-1)
    zeros = torch.zeros(mask.shape, device=device)
    last = out.hidden_states[-1] if hidden else None
    return zeros.masked_scatter(mask, chosen), zeros.masked_scatter(mask, entropy), last


def _logits_only_at(model: Any, columns: torch.Tensor) -> dict[str, Any]:
    """`logits_to_keep` when the model's forward takes it (every transformers causal LM does)."""
    inner = getattr(model, "module", model)  # DDP and FSDP keep the model in `.module`
    return {"logits_to_keep": columns} if _takes_logits_to_keep(type(inner)) else {}


@functools.cache
def _takes_logits_to_keep(model_type: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_type.forward).parameters


def _constrain(picked: torch.Tensor, mask: torch.Tensor, batch: MicroBatch) -> torch.Tensor:
    """-inf outside the sampler's allowed ids at the constrained agent positions."""
    row_of = torch.full(mask.shape, -1, dtype=torch.long, device=mask.device)
    row_of[mask] = torch.arange(picked.shape[0], device=mask.device)
    at = torch.as_tensor(batch.constrained_at, dtype=torch.long, device=mask.device)
    rows = row_of[at[:, 0], at[:, 1]].tolist()
    keep = [(r, ids) for r, ids in zip(rows, batch.constrained_ids, strict=True) if r >= 0]
    if not keep:
        return picked
    blocked = allowed_mask(
        [r for r, _ in keep], [ids for _, ids in keep], tuple(picked.shape), picked.device
    )
    return picked.masked_fill(blocked, float("-inf"))


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
    """Owns the trainable model, the optimizer, the optional critic and frozen reference.

    With a critic, its weights have their own AdamW (lr `CriticSpec.lr`) and lr
    schedule, their own gradient clipping, and go into `state()` for exact
    resume. During the first `CriticSpec.warmup_updates` updates only the
    critic steps: the policy's forward pass runs without gradient.
    """

    def __init__(
        self,
        model: Any,
        algorithm: Algorithm,
        settings: LearnerSettings,
        *,
        reference: Any | None = None,
        critic: Critic | None = None,
        accelerator: Accelerator | None = None,
    ) -> None:
        self.settings = settings
        self.algorithm = algorithm
        self.accelerator = accelerator or Accelerator(cpu=not torch.cuda.is_available())
        self.model, self.optimizer = self.accelerator.prepare(
            model, self._adamw(model, settings.lr)
        )
        self.scheduler = self._lr_schedule(self.optimizer)
        self.reference = reference
        if reference is not None:
            reference.eval().requires_grad_(False)
        self.critic_spec: CriticSpec | None = getattr(algorithm.needs, "critic", None)
        self.critic: Any | None = None
        if self.critic_spec is not None:
            if critic is None and self.critic_spec.separate:
                raise ValueError("the algorithm asks for a separate critic model: pass `critic`")
            critic = critic or Critic(ValueHead(hidden_size(self.unwrapped)))
            lr = self.critic_spec.lr or settings.lr
            critic = critic.to(self.accelerator.device)
            self.critic, self.critic_optimizer = self.accelerator.prepare(
                critic, self._adamw(critic, lr)
            )
            self.critic_scheduler = self._lr_schedule(self.critic_optimizer)
        self._shuffle = random.Random(settings.seed)
        self._on_policy = True
        self._drift, self._drift_tokens = 0.0, 0

    def _adamw(self, module: Any, lr: float) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            module.parameters(),
            lr=lr,
            weight_decay=self.settings.weight_decay,
            betas=self.settings.betas,
        )

    def _lr_schedule(self, optimizer: Any) -> torch.optim.lr_scheduler.LambdaLR:
        settings = self.settings
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda u: lr_factor(u, settings))

    @property
    def unwrapped(self) -> Any:
        """The bare transformers model (for saving and for a shared policy)."""
        return self.accelerator.unwrap_model(self.model)

    @property
    def updates(self) -> int:
        """Updates done so far (the lr schedule's count, so it resumes with the checkpoint)."""
        return int(self.scheduler.last_epoch)

    @property
    def critic_only(self) -> bool:
        """True while the critic warms up: the next update trains only the critic."""
        spec = self.critic_spec
        return spec is not None and self.updates < spec.warmup_updates

    @torch.no_grad()
    def score(self, trajectories: Sequence[Trajectory]) -> None:
        """Set `ref_logprobs` (with a reference) and `values` (with a critic) where still None.

        Called before `Algorithm.advantages`, with the weights that sampled the
        batch; packed like an update, in eval mode as the sampler ran.
        """
        todo = [
            t
            for t in trajectories
            if (self.reference is not None and t.ref_logprobs is None)
            or (self.critic is not None and t.values is None)
        ]
        if not todo:
            return
        self.model.eval()
        if self.critic is not None:
            self.critic.eval()
        batches = pack(
            todo,
            row_tokens=self.settings.row_tokens,
            micro_batch_tokens=self.settings.micro_batch_tokens,
        )
        for mb in batches:
            if self.reference is not None:
                ref, _ = token_logprobs(self.reference, mb, self.settings.temperature)
                for index, values in unpack(mb, ref, todo).items():
                    if todo[index].ref_logprobs is None:
                        todo[index].ref_logprobs = values
            if self.critic is not None:
                shared = self.accelerator.unwrap_model(self.critic).shared
                hidden = last_hidden_state(self.unwrapped.base_model, mb) if shared else None
                for index, values in unpack(mb, self.critic(mb, hidden), todo).items():
                    if todo[index].values is None:
                        todo[index].values = values
        self.model.train()

    def update(self, batch: TrajectoryBatch) -> dict[str, float]:
        """Run every optimizer step for one batch; returns token-weighted mean metrics."""
        start = time.perf_counter()
        trainable = [t for t in batch.trainable if t.advantages is not None]
        if not trainable:
            lr = self.scheduler.get_last_lr()[0]
            self._step_schedules()  # the lr schedule counts updates, trained on or not
            return {"skipped": 1.0, "lr": lr}
        self.score(trainable)  # reference log-probs of trajectories nobody scored yet
        critic_only = self.critic_only
        self.model.train()
        if self.critic is not None:
            self.critic.train()
        sums: dict[str, float] = defaultdict(float)
        weight = 0.0
        slots = real = 0
        steps = 0
        self._on_policy = self.settings.epochs == 1 and self.settings.mini_batches == 1
        self._drift, self._drift_tokens = 0.0, 0
        drift = None if self._on_policy else self._recompute_old_logprobs(trainable)
        for _ in range(self.settings.epochs):
            for mini in self._mini_batches(trainable):
                metrics, tokens, mb_slots, mb_real = self._optimizer_step(mini, critic_only)
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
        if self.critic is not None:
            result["critic_warmup"] = float(critic_only)
            result["critic_lr"] = self.critic_scheduler.get_last_lr()[0]
        self._step_schedules()
        result["update_seconds"] = time.perf_counter() - start
        return result

    def _step_schedules(self) -> None:
        self.scheduler.step()
        if self.critic is not None:
            self.critic_scheduler.step()

    def state(self) -> dict[str, Any]:
        """What a checkpoint needs beyond the weights and optimizer to continue exactly."""
        state = {"shuffle": self._shuffle.getstate(), "scheduler": self.scheduler.state_dict()}
        if self.critic is not None:
            state["critic"] = {
                "weights": self.accelerator.unwrap_model(self.critic).state_dict(),
                "optimizer": self.critic_optimizer.state_dict(),
                "scheduler": self.critic_scheduler.state_dict(),
            }
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of `state`."""
        self._shuffle.setstate(state["shuffle"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.critic is None:
            return
        if "critic" not in state:
            raise ValueError(
                "the checkpoint holds no critic (it was written by a run without one): "
                "resume it with its own algorithm, or start a new run.output_dir"
            )
        self.accelerator.unwrap_model(self.critic).load_state_dict(state["critic"]["weights"])
        self.critic_optimizer.load_state_dict(state["critic"]["optimizer"])
        self.critic_scheduler.load_state_dict(state["critic"]["scheduler"])

    def _mini_batches(self, trajectories: list[Trajectory]) -> list[list[Trajectory]]:
        order = list(range(len(trajectories)))
        self._shuffle.shuffle(order)
        count = min(self.settings.mini_batches, len(order))
        return [[trajectories[i] for i in order[k::count]] for k in range(count)]

    def _optimizer_step(
        self, trajectories: list[Trajectory], critic_only: bool
    ) -> tuple[dict[str, float], float, int, int]:
        micro_batches = pack(
            trajectories,
            row_tokens=self.settings.row_tokens,
            micro_batch_tokens=self.settings.micro_batch_tokens,
        )
        normalizer = float(sum(mb.num_masked for mb in micro_batches)) or 1.0
        sums: dict[str, float] = defaultdict(float)
        for mb in micro_batches:
            inputs = self._loss_inputs(mb, normalizer, critic_only)
            loss, metrics = self.algorithm.loss(inputs)
            self.accelerator.backward(loss)
            share = mb.num_masked / normalizer
            sums["loss"] += float(loss.detach())
            for key, value in metrics.items():
                sums[key] += value * share
        if critic_only:
            self.optimizer.zero_grad(set_to_none=True)  # the step below is then a no-op
        else:
            sums["grad_norm"] = self._clip_gradients(self.model.parameters())
        self.optimizer.step()  # also while warming up: keeps torch's optimizer/schedule order
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic is not None:
            sums["critic_grad_norm"] = self._clip_gradients(self.critic.parameters())
            self.critic_optimizer.step()
            self.critic_optimizer.zero_grad(set_to_none=True)
        slots = sum(mb.slots for mb in micro_batches)
        real = sum(mb.real_tokens for mb in micro_batches)
        return dict(sums), normalizer, slots, real

    def _clip_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> float:
        parameters = [p for p in parameters if p.grad is not None]
        if self.settings.max_grad_norm is None:
            grads = [p.grad.norm() for p in parameters]
            return float(torch.linalg.vector_norm(torch.stack(grads))) if grads else 0.0
        return float(self.accelerator.clip_grad_norm_(parameters, self.settings.max_grad_norm))

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

    def _loss_inputs(self, mb: MicroBatch, normalizer: float, critic_only: bool) -> LossInputs:
        shared = self.critic is not None and self.accelerator.unwrap_model(self.critic).shared
        # While the critic warms up the policy gets no gradient, so its forward needs none.
        with torch.set_grad_enabled(not critic_only):
            logprobs, entropy, hidden = policy_forward(
                self.model,
                mb,
                self.settings.temperature,
                hidden=shared,
                entropy_grad=getattr(self.algorithm.needs, "entropy_grad", True),
            )
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
        with_critic = self.critic is not None
        return LossInputs(
            logprobs=logprobs,
            old_logprobs=old,
            advantages=mb.advantages.to(device),
            mask=mb.mask.to(device),
            entropy=entropy,
            normalizer=normalizer,
            ref_logprobs=mb.ref_logprobs.to(device) if self.reference is not None else None,
            values=self.critic(mb, hidden) if with_critic else None,
            old_values=mb.old_values.to(device) if with_critic else None,
            returns=mb.returns.to(device),
        )
