"""SFT: supervised fine-tuning (behaviour cloning) on agent trajectories.

Behavioural cloning, the first step of AgentEvol in AgentGym,
https://arxiv.org/abs/2406.04151: maximize the likelihood of the agent's
turns given the conversation so far.

Data: AgentTraj JSON files (`files`, paths or globs), saved trajectories
(`trajectories`, JSONL) and/or episodes of the env's own expert generated
at the start of the stage (`expert`). Only
assistant turns marked `loss: true`, or every assistant turn when the field
is absent, carry loss; instructions and observations are context. Sequences
are tokenized exactly as rollouts are, so the trained turns are the tokens
the policy will later sample.

The loss is the token mean of the negative log-likelihood over the
optimizer step's batch: -sum(log p(agent tokens)) / number of agent tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentgym_core.api import AlgorithmNeeds, OfflineDataset, SequenceInputs, Trajectory, read_items


class ExpertData(BaseModel):
    """Expert episodes generated on the fly with the env's `expert_action()`."""

    model_config = ConfigDict(extra="forbid")

    episodes: int = Field(
        200, gt=0, description="First N tasks of the split played by the expert; failures dropped."
    )
    split: str = Field("train", min_length=1, description="Task split the episodes come from.")
    max_turns: int = Field(64, gt=0, description="Turn limit of one expert episode.")
    workers: int = Field(
        1,
        gt=0,
        description="Processes playing the episodes at once, each with its own env (an "
        "expert holds one core); the episodes are the same, in the same order.",
    )
    env: dict[str, Any] = Field(
        default_factory=dict,
        description="Options merged over the stage's env block for these episodes "
        "(e.g. other levels); validated by the env plugin.",
    )


class SFTConfig(BaseModel):
    """Options of `sft`."""

    model_config = ConfigDict(extra="forbid")

    files: list[str] = Field(
        default_factory=list,
        description="AgentTraj JSON files or globs (e.g. from `agentgym data expert`), "
        "relative to the working directory.",
    )
    trajectories: list[str] = Field(
        default_factory=list,
        description="JSONL files or globs of saved trajectories (`tracking.save_rollouts`, an "
        "evolve stage's kept episodes), trained on as they are: every agent turn.",
    )
    expert: ExpertData | None = Field(
        None, description="Generate expert trajectories at the start of the stage; null: none."
    )
    batch_size: int = Field(16, gt=0, description="Trajectories per optimizer step.")

    @model_validator(mode="after")
    def _has_data(self) -> SFTConfig:
        if not self.files and not self.trajectories and self.expert is None:
            raise ValueError(
                "no training data: set files (AgentTraj JSON paths or globs), "
                "trajectories (saved JSONL rollouts) and/or expert: {episodes: N}"
            )
        return self


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
        """One example per trajectory: the files, the expert's episodes, then saved ones."""
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
        examples = [
            (data.sequence(item.conversations, task_id=_task(item.task_id)),) for item in items
        ]
        if self.config.trajectories:
            examples += [(t,) for t in data.rollout_files(self.config.trajectories, "trajectories")]
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


def _task(task_id: int | None) -> int:
    return -1 if task_id is None else task_id
