"""Build the objects of a run from a resolved config and the plugin registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentgym_core import distributed
from agentgym_core.config.errors import ConfigError, Problem
from agentgym_core.interfaces import CriticSpec, Environment, HorizonScheduler, Policy
from agentgym_core.learner import lora
from agentgym_core.learner.critic import Critic, build_critic
from agentgym_core.modeling.attention import prefer_sdpa_gqa
from agentgym_core.modeling.cpu_bf16 import compute_bf16_linears_in_float32
from agentgym_core.modeling.text_config import text_config
from agentgym_core.rollout import contract
from agentgym_core.rollout.chat import set_chat_template_kwargs

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(
    path: str | Path,
    dtype: str = "float32",
    *,
    tokenizer_path: str | Path | None = None,
    trust_remote_code: bool = False,
    gradient_checkpointing: bool = False,
    attn_implementation: str | None = None,
) -> tuple[Any, Any]:
    """A causal LM and its tokenizer from a local folder (Hugging Face format)."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(
            f"model.path: no model folder at {folder}; build one with `agentgym model init` "
            "or point model.path at a Hugging Face checkpoint folder"
        )
    tokenizer = AutoTokenizer.from_pretrained(
        tokenizer_path or folder, trust_remote_code=trust_remote_code
    )
    attention = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            folder,
            dtype="auto" if dtype == "auto" else DTYPES[dtype],
            trust_remote_code=trust_remote_code,
            **attention,
        )
    except (ValueError, ImportError) as error:
        if not attention or "attention" not in str(error).lower():
            raise
        message = attention_problem(attn_implementation, error)
        raise ConfigError([Problem("model.attn_implementation", message)]) from error
    if not attn_implementation:
        prefer_sdpa_gqa(model)  # sdpa without its per-head copies of keys and values
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    # the rank's own device (cuda:<local rank> under accelerate launch), before FSDP's
    # broadcast below: NCCL broadcasts GPU tensors
    model = model.to(distributed.device())
    distributed.share_main_weights(model)  # FSDP's rank-0 loading left zeros elsewhere
    compute_bf16_linears_in_float32(model)  # a CPU without bfloat16 instructions emulates them
    return model, tokenizer


ATTENTION = ("sdpa_gqa", "sdpa", "flash_attention_2", "flex_attention", "eager")
"""`model.attn_implementation` values agentgym is tested with (sdpa_gqa: the default where
transformers' would be sdpa; `modeling/attention.py`)."""


def attention_problem(requested: str | None, error: Exception) -> str:
    """What is wrong with `model.attn_implementation`, from transformers' refusal of it."""
    text = str(error)
    if "flash" in str(requested).lower() and "installed" in text:
        return (
            f"{requested!r} needs the flash-attn package, which is not installed: "
            "`pip install flash-attn` (CUDA GPUs only), or use 'sdpa' (the default) "
            f"or 'eager'. transformers said: {text}"
        )
    if "flash" in str(requested).lower() and "CPU" in text:
        return (
            f"{requested!r} runs on CUDA GPUs only and this machine has none: use 'sdpa' "
            f"(the default) or 'eager'. transformers said: {text}"
        )
    return f"{requested!r}: {text} (agentgym is tested with {', '.join(ATTENTION)})"


def load_configured_model(model_block: Any, path: str | Path | None = None) -> tuple[Any, Any]:
    """`load_model` with the options of the `model` config block (weights from `path` if given).

    A LoRA checkpoint (an adapter and the base it names) loads as its base with
    the adapter merged in, recursively for a chain of LoRA stages; the tokenizer
    is the checkpoint's own.
    """
    folder = path or model_block.path
    if lora.is_adapter_checkpoint(folder):
        base, _ = load_configured_model(model_block, lora.adapter_base(folder))
        tokenizer = AutoTokenizer.from_pretrained(
            folder, trust_remote_code=model_block.trust_remote_code
        )
        set_chat_template_kwargs(tokenizer, model_block.chat_template_kwargs)
        return lora.merged(lora.with_adapter_from(base, folder)), tokenizer
    model, tokenizer = load_model(
        folder,
        model_block.dtype,
        tokenizer_path=None if path else model_block.tokenizer_path,
        trust_remote_code=model_block.trust_remote_code,
        gradient_checkpointing=model_block.gradient_checkpointing,
        attn_implementation=model_block.attn_implementation,
    )
    set_chat_template_kwargs(tokenizer, model_block.chat_template_kwargs)
    return model, tokenizer


ROTARY_KEYS = ("rope_parameters", "rope_theta", "rope_scaling", "rotary_dim", "rotary_pct")
"""Config keys of models whose positions are computed (rotary), not a learned table."""


def check_context_fits(model: Any, max_context_tokens: int, path: str | Path) -> None:
    """Refuse a context longer than a model's learned position table, before any rollout.

    Such a model (GPT-2, OPT) fails with an index error at the first longer episode,
    hours into a run. Rotary models compute positions and run past
    `max_position_embeddings` (with what quality is the user's call), so they pass.
    """
    config = text_config(model)
    if any(getattr(config, key, None) is not None for key in ROTARY_KEYS):
        return
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if limit and max_context_tokens > limit:
        kind = getattr(config, "model_type", "this model")
        raise ConfigError(
            [
                Problem(
                    "rollout.max_context_tokens",
                    f"{max_context_tokens} tokens do not fit the model at {path}: a {kind} "
                    f"has {limit} learned positions; set it to at most {limit}",
                )
            ]
        )


def load_critic(
    spec: CriticSpec | None, policy: Any, model_block: Any, start_model: str | Path
) -> Critic | None:
    """The critic an algorithm asked for; a separate one loads `spec.path` or the start model."""
    if spec is None:
        return None

    def load(path: str | None) -> Any:
        return load_configured_model(model_block, path or start_model)[0]

    return build_critic(spec, policy, load)


@dataclass
class Components:
    """The plugin-provided parts of a run."""

    env_factory: Callable[[], Environment]
    scheduler: HorizonScheduler | None
    """None in evaluation-only configs (they set `eval.max_turns`)."""
    algorithm: Any | None
    policy_factory: Callable[..., Policy]
    policy_stages_weights: bool = False
    """The policy's samplers hold weights of their own, which it stages (`PolicyExtras`)."""


def build_components(resolved: Any) -> Components:
    """Instantiate scheduler and algorithm; return factories for envs and the policy."""
    env_reg, env_cfg = resolved.components["env"]
    policy_reg, policy_cfg = resolved.components["policy"]

    def env_factory() -> Environment:
        return contract.label(env_reg.factory(env_cfg), env_reg.name)  # errors name `babyai`

    def policy_factory(model: Any, tokenizer: Any) -> Policy:
        return policy_reg.factory(policy_cfg, model=model, tokenizer=tokenizer)

    return Components(
        env_factory=env_factory,
        scheduler=_instantiate(resolved, "scheduler"),
        algorithm=_instantiate(resolved, "algorithm"),
        policy_factory=policy_factory,
        policy_stages_weights=stages_weights(policy_reg.factory),
    )


def stages_weights(policy_class: Any) -> bool:
    """Whether a policy class's samplers hold weights of their own, staged for them."""
    if getattr(policy_class, "computes_as_learner", False):
        return False
    return callable(getattr(policy_class, "stage_weights", None))


def _instantiate(resolved: Any, block: str) -> Any | None:
    """The component of `block`, or None when the config leaves it out."""
    if block not in resolved.components:
        return None
    registration, options = resolved.components[block]
    return registration.factory(options)


def check_top_layers(model: Any, top: int | None, path: str | Path) -> None:
    """Refuse `model.lora.top_layers` deeper than the model, naming its depth."""
    if top is None:
        return
    depth = lora.decoder_depth(model)
    if depth is None:
        problem = f"the model at {path} names no num_hidden_layers in its config"
    elif top > depth:
        problem = (
            f"{top} layers asked for, but the model at {path} has {depth}: set at most {depth}"
        )
    else:
        return
    raise ConfigError([Problem("model.lora.top_layers", problem)])
