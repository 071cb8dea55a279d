"""SFT: supervised fine-tuning (behaviour cloning) on agent trajectories.

Behavioural cloning, the first step of AgentEvol in AgentGym,
https://arxiv.org/abs/2406.04151: maximize the likelihood of the agent's
turns given the conversation so far.

Data: AgentTraj JSON files (`files`, paths or globs), saved trajectories
(`trajectories`, JSONL) and/or episodes of the env's own expert generated
at the start of the stage (`expert`), with `expert.roll_in` also the
expert's takeovers of the starting model's own episodes (DAgger-style), and
with `relabel_copies` copies of those conversations with the env's
interchangeable words permuted (`agentgym_core.data.relabel`). Only
assistant turns marked `loss: true`, or every assistant turn when the field
is absent, carry loss; instructions and observations are context, or carry
loss at a lower weight with `observation_loss`. Sequences are tokenized
exactly as rollouts are, so the trained turns are the tokens the policy will
later sample.

The loss is the token mean of the negative log-likelihood over the
optimizer step's batch: -sum(log p(agent tokens)) / number of agent tokens;
with `observation_loss` w > 0 every other token counts w in both sums (the
learner multiplies each token's log-probability by its `loss_mask` value).
"""

from __future__ import annotations

import torch

from agentgym_algo_sft.config import SFTConfig
from agentgym_core.api import AlgorithmNeeds, OfflineDataset, SequenceInputs, Trajectory, read_items


def sft_loss(logprobs: torch.Tensor, total_tokens: float) -> torch.Tensor:
    """Negative log-likelihood summed over the sequences, divided by the step's agent tokens."""
    return -logprobs.sum() / total_tokens


class SFT:
    """The `sft` algorithm."""

    sequences_per_example = 1

    def __init__(self, config: SFTConfig) -> None:
        self.config = config
        self.batch_size = config.batch_size
        self.needs = AlgorithmNeeds(online=False)

    def examples(self, data: OfflineDataset) -> list[tuple[Trajectory, ...]]:
        """One example per trajectory: files, expert episodes, relabelled copies, saved ones."""
        items = [
            item for path in data.files(self.config.files, "files") for item in read_items(path)
        ]
        expert = self.config.expert
        if expert is not None:
            items += data.expert_items(
                episodes=expert.episodes,
                split=expert.split,
                max_turns=expert.max_turns,
                env_options=expert.env,
                key="expert.env",
                workers=expert.workers,
            )
            if expert.roll_in is not None:
                items += data.takeover_items(
                    episodes=expert.roll_in.episodes,
                    split=expert.split,
                    roll_in_turns=expert.roll_in.max_turns,
                    max_turns=expert.max_turns,
                    env_options=expert.env,
                    key="expert.roll_in",
                    workers=expert.workers,
                )
        items += data.relabelled(items, self.config.relabel_copies, "relabel_copies")
        examples = [
            (data.sequence(item.conversations, task_id=_task(item.task_id)),) for item in items
        ]
        if self.config.trajectories:
            examples += [(t,) for t in data.rollout_files(self.config.trajectories, "trajectories")]
        if self.config.observation_loss > 0:
            for (sequence,) in examples:
                weigh_other_tokens(sequence, self.config.observation_loss)
        return examples

    def source_stages(self) -> dict[str, str]:
        """SFT reads no earlier stage's rollouts."""
        return {}

    def sequence_loss(self, inputs: SequenceInputs) -> tuple[torch.Tensor, dict[str, float]]:
        """Token-mean NLL over the step; logs the mean NLL per trajectory and per token."""
        loss = sft_loss(inputs.logprobs, inputs.total_tokens)
        with torch.no_grad():
            nll = -inputs.logprobs.detach()
            per_token = float(nll.sum() / inputs.tokens.sum().clamp(min=1.0))
        return loss, {"sequence_nll": float(nll.mean()), "token_nll": per_token}


def weigh_other_tokens(sequence: Trajectory, weight: float) -> None:
    """Give every token that is not the agent's a loss weight (its `loss_mask` value)."""
    sequence.loss_mask = [1 if agent else weight for agent in sequence.loss_mask]


def _task(task_id: int | None) -> int:
    return -1 if task_id is None else task_id
