"""Options of `sft`: torch-free, so loading the plugin to validate a config stays light."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class RollIn(BaseModel):
    """DAgger-style data: the stage's starting model plays, the expert takes over.

    Cloning shows the model only the expert's states; here the expert finishes episodes
    from states the model reached itself (each cut at a seeded turn), so the model learns
    how to recover from its own mistakes. The stage should start from a trained model
    (`model.path`, or an earlier stage).
    """

    model_config = ConfigDict(extra="forbid")

    episodes: int = Field(
        gt=0,
        description="First N tasks of the expert's split played by the starting model, one "
        "sampled episode each.",
    )
    max_turns: int = Field(64, gt=0, description="Turn limit of the model's episodes.")


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
    roll_in: RollIn | None = Field(
        None,
        description="Also the expert's takeovers of the starting model's episodes "
        "(DAgger-style); the expert has max_turns turns after the cut. null: none.",
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
    relabel_copies: int = Field(
        0,
        ge=0,
        description="Also this many copies of each conversation of `files` and `expert`, "
        "each with the env's interchangeable words (BabyAI: its six colours) "
        "permuted by a seeded draw; 0: none. The env must name them.",
    )
    observation_loss: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Weight of the next-token loss on every other token of an example (the "
        "env's observations, the instruction, the template's tokens) against 1 on the "
        "agent's: an auxiliary language-modelling loss for a model built from scratch, whose "
        "observations teach it to copy names it has read; 0: agent turns only. The logged "
        "loss and token_nll are then the weighted mean over both.",
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
