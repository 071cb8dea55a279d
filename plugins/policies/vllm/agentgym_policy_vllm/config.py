"""Options of the `vllm` policy (the `policy:` block of a config)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class VLLMPolicyConfig(BaseModel):
    """A vLLM engine in the learner's process, fed prompt token ids, synced after each update."""

    model_config = ConfigDict(extra="forbid")

    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="Weights dtype inside vLLM; `auto`: the learner model's own dtype, so a sync "
        "copies without casting and log-probabilities match the learner's.",
    )
    max_num_seqs: int = Field(
        256,
        gt=0,
        description="Most sequences vLLM decodes in one step: the width of continuous batching "
        "across live episodes.",
    )
    max_model_len: int | None = Field(
        None,
        gt=0,
        description="Longest prompt plus answer vLLM accepts; null: the model's window. Keep it at "
        "least `rollout.max_context_tokens`.",
    )
    kv_cache_gib: float | None = Field(
        None,
        gt=0,
        description="KV cache size in GiB; null: vLLM's default (a share of GPU memory set by "
        "`gpu_memory_utilization`, or VLLM_CPU_KVCACHE_SPACE / vLLM's default on CPU).",
    )
    gpu_memory_utilization: float = Field(
        0.4,
        gt=0,
        le=1,
        description="Share of GPU memory vLLM may take when kv_cache_gib is null; the learner "
        "shares the GPU, so this is lower than vLLM's own 0.9.",
    )
    prefix_caching: bool = Field(
        True,
        description="Reuse KV blocks of shared prefixes: each turn re-sends its episode, so only "
        "the new observation is computed. Cleared at every weight sync.",
    )
    enforce_eager: bool = Field(
        False,
        description="Skip torch.compile and CUDA graphs: much faster start (tests, CPU), slower "
        "steps on a GPU.",
    )
    seed: int = Field(0, description="Engine seed, for requests that carry no seed of their own.")
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Other vLLM `EngineArgs` by name (e.g. `max_num_batched_tokens`); they "
        "override the fields set from the options above.",
    )


class VLLMServerPolicyConfig(BaseModel):
    """Replicas of `vllm serve` (started by `agentgym serve-policy`), synced after each update."""

    model_config = ConfigDict(extra="forbid")

    base_urls: list[str] = Field(
        min_length=1,
        description="Base URL of each replica (http://host:port). All turns of an episode go to "
        "one replica; new episodes to the one with the fewest requests in flight.",
    )
    model: str | None = Field(
        None,
        description="Served model name to request; null: the one each replica lists first in "
        "/v1/models.",
    )
    weights_dir: str | None = Field(
        None,
        min_length=1,
        description="Folder the learner writes synced weights to; every replica must read it at "
        "the same path (same host, or a shared file system). null: a temporary folder.",
    )
    timeout_s: float = Field(300.0, gt=0, description="Longest wait for one request.")
    outage_s: float = Field(
        300.0,
        gt=0,
        description="With every replica down, how long a turn waits for one to answer (with "
        "backoff) before the run stops; no checkpoint is written for that update.",
    )
