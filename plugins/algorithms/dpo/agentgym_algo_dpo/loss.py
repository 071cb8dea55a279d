"""DPO: Direct Preference Optimization on whole trajectories.

Paper: Rafailov et al. 2023, https://arxiv.org/abs/2305.18290 (equation 7).
Label smoothing is conservative DPO (cDPO), https://ericmitchell.ai/cdpo.pdf.

An example is a pair of whole trajectories of the same task: the chosen one
(successful) and the rejected one (failed). With log pi(y) summed over the
agent's tokens only (observations are the environment's, not the policy's):

    z    = beta * ((log pi(chosen) - log ref(chosen)) - (log pi(rejected) - log ref(rejected)))
    loss = -(1 - eps) * log sigmoid(z) - eps * log sigmoid(-z),   averaged over pairs

`ref` is the frozen model the stage started from. Pairs come from an earlier
pipeline stage's saved rollouts (`pairs_from`: a successful and a failed
rollout of the same task) and/or pairs files.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from agentgym_algo_dpo.config import DPOConfig
from agentgym_core.api import (
    AlgorithmNeeds,
    OfflineDataset,
    SequenceInputs,
    Termination,
    Trajectory,
    read_pairs,
)


def success_failure_pairs(
    trajectories: Sequence[Trajectory], max_per_task: int, seed: int
) -> list[tuple[Trajectory, Trajectory]]:
    """(successful, failed) trajectories of the same task, each used at most once.

    Env errors and episodes without agent tokens are left out; within a task
    both sides are shuffled with `seed` before pairing.
    """
    by_task: dict[int, tuple[list[Trajectory], list[Trajectory]]] = {}
    for t in trajectories:
        if t.termination == Termination.ENV_ERROR or t.num_sampled_tokens == 0:
            continue
        wins, losses = by_task.setdefault(t.task_id, ([], []))
        (wins if t.success else losses).append(t)
    rng = random.Random(seed)
    pairs = []
    for task in sorted(by_task):
        wins, losses = by_task[task]
        rng.shuffle(wins)
        rng.shuffle(losses)
        pairs += list(zip(wins, losses, strict=False))[:max_per_task]
    return pairs


def dpo_loss(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, beta: float, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair loss and implicit rewards; inputs are [pairs, 2] (chosen, rejected).

    Returns:
        (loss per pair, beta * (log pi - log ref) of chosen, the same of rejected).
    """
    rewards = beta * (logprobs - ref_logprobs)
    chosen, rejected = rewards[:, 0], rewards[:, 1]
    z = chosen - rejected
    loss = -(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    return loss, chosen, rejected


class DPO:
    """The `dpo` algorithm."""

    sequences_per_example = 2

    def __init__(self, config: DPOConfig) -> None:
        self.config = config
        self.batch_size = config.batch_size
        self.needs = AlgorithmNeeds(online=False, reference=True)

    def examples(self, data: OfflineDataset) -> list[tuple[Trajectory, ...]]:
        """Pairs from the earlier stage's rollouts, then from the pair files."""
        pairs: list[tuple[Trajectory, ...]] = []
        if self.config.pairs_from is not None:
            rollouts = data.stage_rollouts(self.config.pairs_from, "pairs_from")
            pairs += success_failure_pairs(rollouts, self.config.max_pairs_per_task, data.seed)
        for path in data.files(self.config.pairs_files, "pairs_files"):
            for pair in read_pairs(path):
                task = -1 if pair.task_id is None else pair.task_id
                pairs.append(
                    (
                        data.sequence(pair.chosen, task_id=task),
                        data.sequence(pair.rejected, task_id=task),
                    )
                )
        return pairs

    def source_stages(self) -> dict[str, str]:
        """`pairs_from` names the stage whose rollouts are read."""
        return {"pairs_from": self.config.pairs_from} if self.config.pairs_from else {}

    def sequence_loss(self, inputs: SequenceInputs) -> tuple[torch.Tensor, dict[str, float]]:
        """Mean DPO loss over the step's pairs; logs implicit rewards, margin and accuracy."""
        if inputs.ref_logprobs is None:
            raise ValueError("dpo needs the reference model's log-probabilities")
        losses, chosen, rejected = dpo_loss(
            inputs.logprobs, inputs.ref_logprobs, self.config.beta, self.config.label_smoothing
        )
        loss = losses.sum() / inputs.total_examples
        with torch.no_grad():
            logp = inputs.logprobs.detach()
            metrics = {
                "reward_chosen": float(chosen.mean()),
                "reward_rejected": float(rejected.mean()),
                "reward_margin": float((chosen - rejected).mean()),
                "reward_accuracy": float((chosen > rejected).float().mean()),
                "logp_chosen": float(logp[:, 0].mean()),
                "logp_rejected": float(logp[:, 1].mean()),
            }
        return loss, metrics
