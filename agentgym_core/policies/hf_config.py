"""Options of the `hf` policy, apart from it: validating a config imports no torch."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class HFPolicyConfig(BaseModel):
    """Options of the `hf` policy."""

    model_config = ConfigDict(extra="forbid")

    max_batch_size: int = Field(64, gt=0, description="Most requests generated together.")
    seed: int = Field(0, description="Seed for requests that carry no seed of their own.")
    prefix_cache: bool = Field(
        True, description="Keep each episode's keys and values between turns; run only new tokens."
    )
    max_sessions: int = Field(4096, gt=0, description="Most episodes whose KV state is kept.")
    kv_cache_dtype: Literal["auto", "model"] = Field(
        "auto",
        description="The dtype of the keys and values kept while sampling. model: the model's; "
        "auto: float32 for a bfloat16 model with sdpa_gqa attention (the default) on a CPU "
        "without bfloat16 instructions, where attention over a bfloat16 cache is emulated "
        "(decoding 4.4x slower at 2,000 tokens), without compile_decode; "
        "the model's otherwise. "
        "float32 holds the bfloat16 keys exactly, in twice the memory.",
    )
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
    split_prefill_tokens: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto",
        description="static batching: prefill a batch as groups of similar uncached tails, "
        "each group's forward pass charged this many padded prefill positions (a new "
        "episode's first prompt among episodes that add one observation pads every row to "
        "its length); the groups write one batch cache and decode together; 0: one group. "
        "auto: 32 on a CPU (measured), one group elsewhere (not measured there: padding "
        "is cheaper on a GPU).",
    )
    compile_decode: bool | Literal["auto"] = Field(
        False,
        description="static batching: run the one-token decode step through torch.compile "
        "(on a GPU mode reduce-overhead: one CUDA graph a step, not hundreds of kernel "
        "launches from Python) on key/value buffers of fixed size kept for the policy's "
        "life, every batch padded to max_batch_size rows. The first batch compiles (tens of "
        "seconds), and again whenever a batch needs more columns (capacity doubles). "
        "Same tokens and log-probs as off. auto: on when the model is on a CUDA device.",
    )

    @model_validator(mode="after")
    def _compiled_static_only(self) -> HFPolicyConfig:
        if self.compile_decode is True and self.batching != "static":
            raise ValueError("compile_decode needs batching: static (continuous is not compiled)")
        return self
