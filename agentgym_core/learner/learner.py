"""The learner: model and AdamW under accelerate, one update per batch of trajectories.

An update reads top to bottom: pick the off-policy correction (`offpolicy`),
let it fix what must be fixed before the first step, then for each epoch and
mini-batch (`plan`) run the micro-batches' forward passes with the sampler's
action constraints (`forward`), hand the algorithm its `LossInputs`, and step.
Trajectories are only read: the correction's old log-probabilities and
weights travel beside them as packed tensors.

Under `accelerate launch` every rank holds the whole batch; each trains on its
token-balanced share of every mini-batch. The loss normaliser is the agent-token
count of the whole mini-batch and each rank's loss is scaled by the world size,
so the gradient DDP (or FSDP) averages over ranks is the single-process
gradient. Ranks run equally many micro-batches, so their collectives pair up;
gradients are reduced once, on the last backward of each optimizer step.
Forward passes without gradient (scoring, up-front old log-probabilities) use
the bare model: no collectives.
"""

from __future__ import annotations

import contextlib
import copy
import math
import random
import time
import warnings
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

from agentgym_core import distributed
from agentgym_core.heap import release_freed_memory
from agentgym_core.interfaces import Algorithm, CriticSpec, LossInputs
from agentgym_core.learner import lora
from agentgym_core.learner.critic import Critic, CriticTrainer, ValueHead, hidden_size
from agentgym_core.learner.forward import own_logprobs, policy_forward
from agentgym_core.learner.offpolicy import Columns, Correction, active_dropout, correction_for
from agentgym_core.learner.packing import MicroBatch
from agentgym_core.learner.plan import micro_batch_plan, mini_batches
from agentgym_core.learner.precision import MasterWeights
from agentgym_core.learner.settings import LearnerSettings, adamw, lr_schedule
from agentgym_core.types import Trajectory, TrajectoryBatch


class Learner:
    """Owns the trainable model, its optimizer, the optional critic and frozen reference.

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
        if self.sharded and lora.is_adapter(model):
            raise ValueError(
                "model.lora under FSDP is not supported yet: an adapter is small enough to "
                "train under DDP (accelerate's MULTI_GPU), or train without model.lora"
            )
        self._replica = copy.deepcopy(model) if self.sharded else None
        if not self.sharded:  # the masters are made beside the weights they train
            model = model.to(self.accelerator.device)
        self.masters = MasterWeights(model.parameters())
        if self.masters.pairs and self.sharded:
            raise ValueError(
                "model.dtype below float32 under FSDP: load float32 weights (model.dtype: "
                "float32) and let FSDP compute in bf16 (accelerate's mixed_precision: bf16)"
            )
        optimized = self.masters.optimized(model.parameters())
        self.model, self.optimizer = self.accelerator.prepare(
            model, adamw(optimized, settings.lr, settings)
        )
        self.scheduler = lr_schedule(self.optimizer, settings)
        self.reference = reference
        if reference is not None:
            reference.eval().requires_grad_(False)
        self.critic = self._critic(getattr(algorithm.needs, "critic", None), critic)
        self._shuffle = random.Random(settings.seed)
        self._dropout = active_dropout(self.unwrapped)

    def _critic(self, spec: CriticSpec | None, critic: Critic | None) -> CriticTrainer | None:
        if spec is None:
            return None
        if self.sharded:
            raise ValueError(
                "a critic (PPO) is not supported under FSDP: use DDP (accelerate's "
                "MULTI_GPU) or an algorithm without a critic (grpo, rloo, reinforce_pp)"
            )
        if critic is None and spec.separate:
            raise ValueError("the algorithm asks for a separate critic model: pass `critic`")
        critic = critic or Critic(ValueHead(hidden_size(self.unwrapped)))
        return CriticTrainer(spec, critic, self.accelerator, self.settings)

    # -- the update -----------------------------------------------------------------------

    def update(
        self, batch: TrajectoryBatch, correction: Correction | None = None
    ) -> dict[str, float]:
        """Run every optimizer step for one batch; returns token-weighted mean metrics.

        Trajectories without advantages are left out. The batch must be scored
        already (`scoring.score`) when the algorithm uses a reference or critic.
        `correction`: the off-policy correction; None: the one the settings call
        for (`offpolicy.correction_for`).
        """
        start = time.perf_counter()
        trainable = [t for t in batch.trainable if t.advantages is not None]
        if not trainable:
            lr = self.scheduler.get_last_lr()[0]
            self._step_schedules()  # the lr schedule counts updates, trained on or not
            return {"skipped": 1.0, "lr": lr}
        self._check_scored(trainable)
        correction = correction or correction_for(
            self.settings.off_policy, steps=self.settings.steps_per_batch, dropout=self._dropout
        )
        columns = correction.prepare(trainable, self._proximal)
        critic_only = self.critic_only
        self.model.train()
        if self.critic is not None:
            self.critic.module.train()
        sums: dict[str, float] = defaultdict(float)
        weight, steps, slots, real = 0.0, 0, 0, 0
        for _ in range(self.settings.epochs):
            for indices in mini_batches(len(trainable), self.settings.mini_batches, self._shuffle):
                metrics, tokens, mb_slots, mb_real = self._optimizer_step(
                    trainable, indices, columns, correction, critic_only
                )
                for key, value in metrics.items():
                    sums[key] += value * tokens
                weight += tokens
                slots, real, steps = slots + mb_slots, real + mb_real, steps + 1
        result = {k: v / max(weight, 1.0) for k, v in sums.items()}
        result.update(correction.stats())
        result["padding_fraction"] = 1.0 - real / max(slots, 1)
        result["optimizer_steps"] = float(steps)
        result["lr"] = self.scheduler.get_last_lr()[0]
        if self.critic is not None:
            result["critic_warmup"] = float(critic_only)
            result["critic_lr"] = self.critic.scheduler.get_last_lr()[0]
        self._step_schedules()
        self.finish_update()
        result["update_seconds"] = time.perf_counter() - start
        return result

    def _optimizer_step(
        self,
        trajectories: list[Trajectory],
        indices: list[int],
        columns: Columns,
        correction: Correction,
        critic_only: bool,
    ) -> tuple[dict[str, float], float, int, int]:
        """One optimizer step on the mini-batch `indices`.

        Returns its metrics, its agent-token count, and its token slots and real tokens.
        """
        # agent tokens of the whole mini-batch (every rank's share): the token mean's denominator
        normalizer = float(sum(sum(trajectories[i].loss_mask[1:]) for i in indices)) or 1.0
        sums: dict[str, float] = defaultdict(float)
        plan = micro_batch_plan(trajectories, indices, columns, self.settings)
        for index, (mb, weight) in enumerate(plan):
            with self.gradient_sync(index == len(plan) - 1):
                inputs = self._loss_inputs(mb, normalizer, correction, critic_only, real=weight > 0)
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
        # while the critic warms up the policy's step is a no-op; it still runs, to keep
        # torch's optimizer/schedule order
        grad_norm = self.apply_gradients(clip=not critic_only)
        if grad_norm is not None:
            sums["grad_norm"] = grad_norm
        if self.critic is not None:
            sums["critic_grad_norm"] = self.critic.step(self.clip_gradients)
        return dict(sums), normalizer, slots, real

    def _loss_inputs(
        self,
        mb: MicroBatch,
        normalizer: float,
        correction: Correction,
        critic_only: bool,
        *,
        real: bool = True,
    ) -> LossInputs:
        shared = self.critic is not None and self.critic.bare.shared
        # While the critic warms up the policy gets no gradient, so its forward needs none.
        with torch.set_grad_enabled(not critic_only):
            logprobs, entropy, hidden = policy_forward(
                self.model,
                mb,
                self.settings.temperature,
                hidden=shared,
                entropy_grad=getattr(self.algorithm.needs, "entropy_grad", True),
                chunk_tokens=self.settings.logprob_chunk_tokens,
            )
        device = logprobs.device
        # which old log-probs, and advantages scaled by behaviour weights if the batch is stale
        old, advantages = correction.apply(logprobs, mb, real=real)
        critic = self.critic
        return LossInputs(
            logprobs=logprobs,
            old_logprobs=old,
            advantages=advantages,
            mask=mb.mask.to(device),
            entropy=entropy,
            normalizer=normalizer,
            ref_logprobs=mb.ref_logprobs.to(device) if self.reference is not None else None,
            values=critic.module(mb, hidden) if critic is not None else None,
            old_values=mb.old_values.to(device) if critic is not None else None,
            returns=mb.returns.to(device),
        )

    @torch.no_grad()
    def _proximal(self, trajectories: Sequence[Trajectory]) -> list[tuple[list[float], float, int]]:
        """The learner's eval-mode log-probabilities of each trajectory (see `offpolicy.Proximal`).

        One trajectory at a time, so values do not depend on batching; each rank
        computes its contiguous share and all ranks get every result.
        """
        model = self.unwrapped
        model.eval()  # as the sampler ran: no dropout in the fixed "old" values
        temperature, chunk = self.settings.temperature, self.settings.logprob_chunk_tokens
        results = distributed.gather(
            [
                own_logprobs(model, t, temperature, chunk_tokens=chunk)
                for t in distributed.shard(list(trajectories))
            ]
        )
        self.model.train()
        return results

    def _check_scored(self, trajectories: list[Trajectory]) -> None:
        missing = [
            name
            for name, model, field in (
                ("reference", self.reference, "ref_logprobs"),
                ("critic", self.critic, "values"),
            )
            if model is not None and any(getattr(t, field) is None for t in trajectories)
        ]
        if missing:
            raise ValueError(
                f"the batch has no {' or '.join(missing)} scores: call "
                "agentgym_core.learner.scoring.score(learner, trajectories) before the "
                "algorithm's advantages"
            )

    # -- schedules, gradients, state ------------------------------------------------------

    @property
    def unwrapped(self) -> Any:
        """The bare transformers model with full weights (for saving and for a shared policy)."""
        if self._replica is not None:
            return self._replica
        return self.accelerator.unwrap_model(self.model)

    @property
    def updates(self) -> int:
        """Updates done so far (the lr schedule's count, so it resumes with the checkpoint)."""
        return int(self.scheduler.last_epoch)

    @property
    def critic_only(self) -> bool:
        """True while the critic warms up: the next update trains only the critic."""
        return self.critic is not None and self.updates < self.critic.spec.warmup_updates

    @property
    def world(self) -> int:
        """Number of data-parallel ranks."""
        return distributed.world_size()

    def _step_schedules(self) -> None:
        # A skipped update (nothing to train on) still counts for the schedule; before the
        # first optimizer step torch warns that the order is wrong, which it is not here.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)`")
            self.scheduler.step()
            if self.critic is not None:
                self.critic.scheduler.step()

    @contextlib.contextmanager
    def gradient_sync(self, sync: bool) -> Iterator[None]:
        """Keep gradients local unless `sync`: ranks reduce them once, on a step's last pass."""
        with contextlib.ExitStack() as stack:
            if not sync and self.world > 1:
                modules = [self.model] + ([self.critic.module] if self.critic is not None else [])
                for module in modules:
                    stack.enter_context(self.accelerator.no_sync(module))
            yield

    def apply_gradients(self, *, clip: bool = True) -> float | None:
        """One optimizer step on the gradients the backward passes left; returns their norm.

        Low-precision weights step through their float32 masters (`precision`).
        `clip=False` drops the gradients instead (the step then changes nothing).
        """
        self.masters.gradients_to_masters()
        norm = None
        if clip:
            stepped = self.masters.optimized(self.model.parameters())
            norm = self.clip_gradients(stepped if self.masters.pairs else self.model.parameters())
        else:
            self.optimizer.zero_grad(set_to_none=True)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.masters.masters_to_model()
        return norm

    def master_bytes(self) -> int:
        """Memory of the float32 master weights (0 for float32 models)."""
        return self.masters.bytes()

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

    def finish_update(self) -> None:
        """After an update's last optimizer step (online or offline).

        The FSDP replica gets the new weights; on a CPU the update's freed
        activations go back to the system, which glibc would otherwise keep (`heap`).
        """
        self.refresh_replica()
        if self.accelerator.device.type == "cpu":
            release_freed_memory()

    def refresh_replica(self) -> None:
        """Copy the sharded weights into the full replica (FSDP only; a collective)."""
        if self._replica is not None:
            self._replica.load_state_dict(distributed.full_model_state(self.model))

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

    def state(self) -> dict[str, Any]:
        """What a checkpoint needs beyond the weights and optimizer to continue exactly."""
        state = {"shuffle": self._shuffle.getstate(), "scheduler": self.scheduler.state_dict()}
        if self.masters.pairs:
            state["masters"] = self.masters.state()
        if self.critic is not None:
            state["critic"] = self.critic.state()
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of `state`."""
        self._shuffle.setstate(state["shuffle"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.masters.pairs or "masters" in state:
            self.masters.load_state(state.get("masters", []))
        if self.critic is None:
            return
        if "critic" not in state:
            raise ValueError(
                "the checkpoint holds no critic (it was written by a run without one): "
                "resume it with its own algorithm, or start a new run.output_dir"
            )
        self.critic.load_state(state["critic"])
