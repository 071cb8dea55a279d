"""The learner: model and AdamW under accelerate, one update per batch of trajectories.

Before the algorithm's `advantages`, `score` puts the frozen reference's
log-probabilities and the critic's values on the trajectories (when the
algorithm needs them). An update then splits the trainable trajectories into
mini-batches (one optimizer step each, repeated for `epochs`), packs each
mini-batch into micro-batches, recomputes log-probabilities with the sampler's
action constraints (and values, with a critic), and asks the algorithm for the loss.

Under `accelerate launch` every rank holds the whole batch; each trains on its
token-balanced share of every mini-batch. The loss normaliser is the agent-token
count of the whole mini-batch and each rank's loss is scaled by the world size,
so the gradient DDP (or FSDP) averages over ranks is the single-process
gradient. Ranks run equally many micro-batches (a rank short of work runs
zero-weight ones), so their collectives pair up; gradients are reduced once,
on the last backward of each optimizer step. Forward passes without gradient
(scoring, recomputed log-probabilities) use the bare model: no collectives.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import math
import random
import time
import warnings
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

from agentgym_core import distributed
from agentgym_core.interfaces import Algorithm, CriticSpec, LossInputs
from agentgym_core.learner.critic import Critic, ValueHead, hidden_size, last_hidden_state
from agentgym_core.learner.decoupled import ImportanceTally, importance_weights
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
    share_rows: bool = True
    max_grad_norm: float | None = 1.0
    temperature: float = 1.0
    seed: int = 0
    importance_cap: float | None = None
    """Set with stale rollouts: decoupled PPO's truncated behaviour weight (`decoupled`)."""


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

    Under FSDP the prepared model holds only a shard of each weight, so the
    learner also keeps a full replica (`unwrapped`), refreshed after every
    update: the policy generates with it, checkpoints save it, and forward
    passes without gradient run on it.
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
        self.sharded = self.accelerator.distributed_type == DistributedType.FSDP
        self._replica = copy.deepcopy(model) if self.sharded else None
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
            if self.sharded:
                raise ValueError(
                    "a critic (PPO) is not supported under FSDP: use DDP (accelerate's "
                    "MULTI_GPU) or an algorithm without a critic (grpo, rloo, reinforce_pp)"
                )
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
        self._tally: ImportanceTally | None = None
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
        """The bare transformers model with full weights (for saving and for a shared policy)."""
        if self._replica is not None:
            return self._replica
        return self.accelerator.unwrap_model(self.model)

    def optimizer_state(self) -> dict[str, Any]:
        """The optimizer's state for a checkpoint (under FSDP: a collective, full on main only)."""
        if not self.sharded:
            return self.optimizer.state_dict()
        return distributed.full_optimizer_state(self.model, self.optimizer.optimizer)

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        """Inverse of `optimizer_state` (every rank passes the full state it read)."""
        if not self.sharded:
            self.optimizer.load_state_dict(state)
            return
        distributed.load_full_optimizer_state(self.model, self.optimizer.optimizer, state)

    def refresh_replica(self) -> None:
        """Copy the sharded weights into the full replica (FSDP only; a collective)."""
        if self._replica is not None:
            self._replica.load_state_dict(distributed.full_model_state(self.model))

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
        batch; packed like an update, in eval mode as the sampler ran. Each rank
        scores its contiguous share and every rank gets all values (a collective
        when anything is left to score: call it on every rank with the same batch).
        """
        todo = [
            t
            for t in trajectories
            if (self.reference is not None and t.ref_logprobs is None)
            or (self.critic is not None and t.values is None)
        ]
        if not todo:
            return
        mine = distributed.shard(todo)
        scored = distributed.gather(self._score(mine) if mine else [])
        for traj, (ref, values) in zip(todo, scored, strict=True):
            if traj.ref_logprobs is None:
                traj.ref_logprobs = ref
            if traj.values is None:
                traj.values = values

    def _score(self, todo: list[Trajectory]) -> list[tuple[list[float] | None, list[float] | None]]:
        """(reference log-probs, values) of each trajectory, None where there is no such model."""
        self.unwrapped.eval()
        critic = self.accelerator.unwrap_model(self.critic) if self.critic is not None else None
        if critic is not None:
            critic.eval()
        batches = pack(
            todo,
            row_tokens=self.settings.row_tokens,
            share_rows=self.settings.share_rows,
            micro_batch_tokens=self.settings.micro_batch_tokens,
        )
        ref: dict[int, list[float]] = {}
        values: dict[int, list[float]] = {}
        for mb in batches:
            if self.reference is not None:
                logprobs, _ = token_logprobs(self.reference, mb, self.settings.temperature)
                ref.update(unpack(mb, logprobs, todo))
            if critic is not None:
                hidden = last_hidden_state(self.unwrapped.base_model, mb) if critic.shared else None
                values.update(unpack(mb, critic(mb, hidden), todo))
        self.model.train()
        return [(ref.get(i), values.get(i)) for i in range(len(todo))]

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
        decoupled = {}
        self._on_policy = self.settings.epochs == 1 and self.settings.mini_batches == 1
        cap = self.settings.importance_cap
        # one optimizer step: the loss's own forward pass is the proximal policy (see decoupled)
        self._tally = ImportanceTally(cap) if cap is not None and self._on_policy else None
        if cap is not None and not self._on_policy:
            decoupled = self._decouple(trainable, cap)
        self._drift, self._drift_tokens = 0.0, 0
        drift = None
        if decoupled:  # the "old" log-probabilities are the proximal ones already
            drift = decoupled.pop("behaviour_logprob_diff")
        elif not self._on_policy:
            drift = self._recompute_old_logprobs(trainable)
        for _ in range(self.settings.epochs):
            for mini in self._mini_batches(trainable):
                metrics, tokens, mb_slots, mb_real = self._optimizer_step(mini, critic_only)
                for key, value in metrics.items():
                    sums[key] += value * tokens
                weight += tokens
                slots, real = slots + mb_slots, real + mb_real
                steps += 1
        result = {k: v / max(weight, 1.0) for k, v in sums.items()}
        if self._tally is not None:
            decoupled = self._tally.stats()
            drift = decoupled.pop("behaviour_logprob_diff")
        elif drift is None:
            seen = distributed.sum_over_ranks({"diff": self._drift, "tokens": self._drift_tokens})
            drift = seen["diff"] / max(seen["tokens"], 1)
        result["sampler_logprob_diff"] = drift
        result.update(decoupled)
        result["padding_fraction"] = 1.0 - real / max(slots, 1)
        result["optimizer_steps"] = float(steps)
        result["lr"] = self.scheduler.get_last_lr()[0]
        if self.critic is not None:
            result["critic_warmup"] = float(critic_only)
            result["critic_lr"] = self.critic_scheduler.get_last_lr()[0]
        self._step_schedules()
        self.refresh_replica()
        result["update_seconds"] = time.perf_counter() - start
        return result

    def _step_schedules(self) -> None:
        # A skipped update (nothing to train on) still counts for the schedule; before the
        # first optimizer step torch warns that the order is wrong, which it is not here.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
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
        # agent tokens of the whole mini-batch (every rank's share): the token mean's denominator
        normalizer = float(sum(sum(t.loss_mask[1:]) for t in trajectories)) or 1.0
        sums: dict[str, float] = defaultdict(float)
        plan = self._micro_batch_plan(trajectories)
        for index, (mb, weight) in enumerate(plan):
            with self.gradient_sync(index == len(plan) - 1):
                inputs = self._loss_inputs(mb, normalizer, critic_only, real=weight > 0)
                loss, metrics = self.algorithm.loss(inputs)
                # DDP averages over ranks: x world makes the reduced gradient the full batch's
                scale = weight * self.world
                self.accelerator.backward(loss if scale == 1.0 else loss * scale)
            sums["slots"] += mb.slots
            if weight == 0:
                continue  # a stand-in that only pairs this rank's collectives with the others'
            share = mb.num_masked / normalizer
            sums["loss"] += float(loss.detach())
            for key, value in metrics.items():
                sums[key] += value * share
            sums["real"] += mb.real_tokens
        sums = defaultdict(float, distributed.sum_over_ranks(sums))
        slots, real = int(sums.pop("slots")), int(sums.pop("real", 0))
        if critic_only:
            self.optimizer.zero_grad(set_to_none=True)  # the step below is then a no-op
        else:
            sums["grad_norm"] = self.clip_gradients(self.model.parameters())
        self.optimizer.step()  # also while warming up: keeps torch's optimizer/schedule order
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic is not None:
            sums["critic_grad_norm"] = self.clip_gradients(self.critic.parameters())
            self.critic_optimizer.step()
            self.critic_optimizer.zero_grad(set_to_none=True)
        return dict(sums), normalizer, slots, real

    def _micro_batch_plan(self, trajectories: list[Trajectory]) -> list[tuple[MicroBatch, float]]:
        """This rank's micro-batches of a mini-batch, each with its loss weight.

        Each rank packs its token-balanced share; ranks with fewer micro-batches
        than the busiest add weight-0 passes over the shortest trajectory.
        """
        parts = distributed.split_by_tokens([len(t.token_ids) for t in trajectories], self.world)
        mine = [trajectories[i] for i in parts[distributed.rank()]]
        micro, rows = self.settings.micro_batch_tokens, self.settings.row_tokens
        share = self.settings.share_rows
        packed = (
            pack(mine, row_tokens=rows, micro_batch_tokens=micro, share_rows=share) if mine else []
        )

        def spare() -> MicroBatch:
            shortest = min(trajectories, key=lambda t: len(t.token_ids))
            return pack([shortest], row_tokens=None, micro_batch_tokens=len(shortest.token_ids))[0]

        return distributed.pad_to_busiest(packed, spare)

    @contextlib.contextmanager
    def gradient_sync(self, sync: bool) -> Iterator[None]:
        """Keep gradients local unless `sync`: ranks reduce them once, on a step's last pass."""
        with contextlib.ExitStack() as stack:
            if not sync and self.world > 1:
                for module in (self.model, self.critic):
                    if module is not None:
                        stack.enter_context(self.accelerator.no_sync(module))
            yield

    @property
    def world(self) -> int:
        """Number of data-parallel ranks."""
        return distributed.world_size()

    def clip_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> float:
        """Clip to `max_grad_norm` (after the ranks' reduction); returns the norm before."""
        parameters = [p for p in parameters if p.grad is not None]
        limit = self.settings.max_grad_norm
        if limit is None and not self.sharded:
            grads = [p.grad.norm() for p in parameters]
            return float(torch.linalg.vector_norm(torch.stack(grads))) if grads else 0.0
        # sharded gradients need accelerate's norm over all shards; an infinite limit clips nothing
        limit = math.inf if limit is None else limit
        return float(self.accelerator.clip_grad_norm_(parameters, limit))

    @torch.no_grad()
    def _recompute_old_logprobs(self, trajectories: list[Trajectory]) -> float:
        """Replace the sampler's log-probabilities by the learner's; returns their mean |diff|.

        Several optimizer steps per batch need fixed "old" log-probabilities. The
        learner's own make the update a deterministic function of the sampled
        tokens (the sampler's vary in the last bits with how requests were batched).
        Each rank computes its contiguous share; all ranks get every result.
        """
        model = self.unwrapped
        model.eval()  # as the sampler ran: no dropout in the fixed "old" values
        results = distributed.gather(
            [self._own_logprobs(model, t) for t in distributed.shard(trajectories)]
        )
        self.model.train()
        diff, count = 0.0, 0
        for traj, (fresh, traj_diff, traj_count) in zip(trajectories, results, strict=True):
            traj.logprobs = fresh
            diff, count = diff + traj_diff, count + traj_count
        return diff / max(count, 1)

    @torch.no_grad()
    def _decouple(self, trajectories: list[Trajectory], cap: float) -> dict[str, float]:
        """Decoupled PPO, weighed up front (several optimizer steps per batch; see `decoupled`).

        The "old" log-probabilities become the proximal ones (the learner's now) and each
        token's advantage is scaled by its truncated behaviour weight. Returns the weights'
        statistics.
        """
        model = self.unwrapped
        model.eval()
        results = distributed.gather(
            [self._own_logprobs(model, t) for t in distributed.shard(trajectories)]
        )
        self.model.train()
        raw_all: list[float] = []
        diff, count = 0.0, 0
        for traj, (proximal, traj_diff, traj_count) in zip(trajectories, results, strict=True):
            weights, raw = importance_weights(proximal, traj.logprobs, traj.loss_mask, cap)
            traj.advantages = [a * w for a, w in zip(traj.advantages, weights, strict=True)]
            traj.logprobs = proximal
            raw_all += raw
            diff, count = diff + traj_diff, count + traj_count
        tokens = max(len(raw_all), 1)
        return {
            "behaviour_logprob_diff": diff / max(count, 1),
            "importance_weight_mean": sum(min(r, cap) for r in raw_all) / tokens,
            "importance_weight_max": max(raw_all, default=1.0),
            "importance_truncated_fraction": sum(r > cap for r in raw_all) / tokens,
        }

    def _own_logprobs(self, model: Any, traj: Trajectory) -> tuple[list[float], float, int]:
        """The model's log-probabilities of `traj`, their summed |diff| to the sampler's, count."""
        (mb,) = pack([traj], row_tokens=None, micro_batch_tokens=len(traj.token_ids))
        logprobs, _ = token_logprobs(model, mb, self.settings.temperature)
        mask = mb.mask[0].bool()
        fresh = torch.zeros(len(traj.token_ids))
        fresh[1:][mask[:-1]] = logprobs[0, :-1][mask[:-1]].float().cpu()
        diff = float((fresh[1:][mask[:-1]] - mb.old_logprobs[0, :-1][mask[:-1]]).abs().sum())
        return fresh.tolist(), diff, int(mask.sum())

    def _loss_inputs(
        self, mb: MicroBatch, normalizer: float, critic_only: bool, *, real: bool = True
    ) -> LossInputs:
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
        mask = mb.mask.to(device)
        advantages = mb.advantages.to(device)
        if self._tally is not None:  # sampled by stale weights: scale by the behaviour weight
            advantages = advantages * self._tally.weigh(old, sampler, mask, tally=real)
        elif self._on_policy and real:
            self._drift += float(((old - sampler).abs() * mask).sum())
            self._drift_tokens += int(mask.sum())
        with_critic = self.critic is not None
        return LossInputs(
            logprobs=logprobs,
            old_logprobs=old,
            advantages=advantages,
            mask=mask,
            entropy=entropy,
            normalizer=normalizer,
            ref_logprobs=mb.ref_logprobs.to(device) if self.reference is not None else None,
            values=self.critic(mb, hidden) if with_critic else None,
            old_values=mb.old_values.to(device) if with_critic else None,
            returns=mb.returns.to(device),
        )
