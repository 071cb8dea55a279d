"""Options of the `hf` policy, apart from it: validating a config imports no torch."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class HFPolicyConfig(BaseModel):
    """Options of the `hf` policy."""

    model_config = ConfigDict(extra="forbid")

    max_batch_size: int = Field(64, gt=0, description="Most requests generated together.")
    seed: int = Field(0, description="Seed for requests that carry no seed of their own.")
    prefix_cache: bool = Field(
        True, description="Keep each episode's keys and values between turns; run only new tokens."
    )
    max_sessions: int = Field(4096, gt=0, description="Most episodes whose KV state is kept.")
    batching: Literal["static", "continuous"] = Field(
        "static",
        description="static: a batch runs until its longest request is done; continuous: "
        "requests join the running batch at the next decode step and leave when done.",
    )
    gather_ms: float = Field(
        5.0,
        ge=0,
        description="static: after a batch's first request, keep admitting requests while "
        "each arrives within this many ms of the last (episodes whose env calls finish "
        "together join one batch); 0: only those already waiting.",
    )
    num_threads: int = Field(
        0,
        ge=0,
        description="CPU threads of generation's own torch ops (torch counts threads per "
        "calling thread; the learner keeps its own count); 0: torch's count when the policy "
        "starts. Fewer than the cores can be faster for a small model's one-token passes, "
        "which parallelise poorly and stall when env work or other processes hold a core.",
    )
