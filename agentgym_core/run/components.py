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
from agentgym_core.learner.critic import Critic, build_critic

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
        problem = Problem("model.attn_implementation", f"{attn_implementation!r}: {error}")
        raise ConfigError([problem]) from error
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    if torch.cuda.is_available():
        model = model.to("cuda")
    distributed.share_main_weights(model)  # FSDP's rank-0 loading left zeros elsewhere
    return model, tokenizer


def load_configured_model(model_block: Any, path: str | Path | None = None) -> tuple[Any, Any]:
    """`load_model` with the options of the `model` config block (weights from `path` if given)."""
    return load_model(
        path or model_block.path,
        model_block.dtype,
        tokenizer_path=None if path else model_block.tokenizer_path,
        trust_remote_code=model_block.trust_remote_code,
        gradient_checkpointing=model_block.gradient_checkpointing,
        attn_implementation=model_block.attn_implementation,
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


def build_components(resolved: Any) -> Components:
    """Instantiate scheduler and algorithm; return factories for envs and the policy."""
    env_reg, env_cfg = resolved.components["env"]
    policy_reg, policy_cfg = resolved.components["policy"]

    def env_factory() -> Environment:
        return env_reg.factory(env_cfg)

    def policy_factory(model: Any, tokenizer: Any) -> Policy:
        return policy_reg.factory(policy_cfg, model=model, tokenizer=tokenizer)

    return Components(
        env_factory=env_factory,
        scheduler=_instantiate(resolved, "scheduler"),
        algorithm=_instantiate(resolved, "algorithm"),
        policy_factory=policy_factory,
    )


def _instantiate(resolved: Any, block: str) -> Any | None:
    """The component of `block`, or None when the config leaves it out."""
    if block not in resolved.components:
        return None
    registration, options = resolved.components[block]
    return registration.factory(options)
