"""The `model` block: which model a run trains or evaluates, and how (dtype, LoRA, kernels).

Field descriptions are the reference users read, so keep them exact.
"""

from __future__ import annotations

import importlib.util
from typing import Any, Literal

from pydantic import Field, model_validator

from agentgym_core.config.block import Block


class LoraConfig(Block):
    """A LoRA adapter (PEFT) trained instead of the whole model.

    The base weights stay frozen; the KL reference is the same model with the
    adapter turned off. Checkpoints hold the adapter and name their base
    (`agentgym model merge` writes standalone merged weights).
    """

    r: int = Field(16, gt=0, description="Rank of the update matrices.")
    alpha: float = Field(
        32.0, gt=0, description="Scale numerator: updates are scaled by alpha / r."
    )
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Dropout on the adapter's input (above 0, stale rollouts are weighed in an "
        "eval-mode pass up front).",
    )
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear",
        description="Module names (or suffixes) that get an adapter, e.g. [q_proj, v_proj]; "
        "all-linear: every linear layer but the output head.",
    )
    top_layers: int | None = Field(
        None,
        gt=0,
        description="Adapters on the last N decoder layers only; null: on every layer. No "
        "gradient flows below the lowest adapter, so the backward pass skips the layers under "
        "it (a cheaper update; the layers under it keep their start weights).",
    )
    bias: Literal["none", "all", "lora_only"] = Field(
        "none", description="Which biases train along with the adapter."
    )
    modules_to_save: list[str] | None = Field(
        None, description="Modules trained in full beside the adapter (e.g. [lm_head])."
    )
    use_rslora: bool = Field(
        False, description="Rank-stabilised scaling alpha / sqrt(r) (Kalajdzievski 2023)."
    )
    adapter_dtype: Literal["float32", "model"] = Field(
        "float32",
        description="float32: PEFT's default, the adapter computes in float32 on a lower-precision "
        "base (no master copies, a cast around each adapted layer); model: the adapter in "
        "`model.dtype`, stepped through float32 master copies as full fine-tuning is.",
    )

    @model_validator(mode="after")
    def _peft_installed(self) -> LoraConfig:
        if importlib.util.find_spec("peft") is None:
            raise ValueError(
                "LoRA needs peft, which is not installed: pip install 'agentgym-core[lora]'"
            )
        return self


class ModelConfig(Block):
    """The language model being trained or evaluated."""

    path: str = Field(
        min_length=1, description="Hugging Face checkpoint folder (or hub id where reachable)."
    )
    tokenizer_path: str | None = Field(
        None, min_length=1, description="Tokenizer folder when it differs from `path`."
    )
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field(
        "float32",
        description="Weights dtype; `auto` keeps the checkpoint's. Weights below float32 train "
        "with float32 master copies in the optimizer (the model computes in `dtype`).",
    )
    trust_remote_code: bool = Field(
        False, description="Allow the checkpoint's own modeling code (runs code from the folder)."
    )
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in the backward pass to save memory."
    )
    attn_implementation: str | None = Field(
        None,
        min_length=1,
        description="transformers' attention kernel (sdpa, eager, flash_attention_2, ...); "
        "null: transformers' default, with sdpa replaced by agentgym's sdpa_gqa (the same "
        "attention, without copying grouped keys and values per head on a CPU). Under flash "
        "attention and flex_attention (CUDA: torch has no flex backward pass on a CPU) "
        "`trainer.packing: auto` shares rows.",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Variables passed to the chat template wherever a conversation is rendered, "
        "e.g. {enable_thinking: false} for Qwen3's non-thinking mode (docs/models.md).",
    )
    lora: LoraConfig | None = Field(
        None, description="Train a LoRA adapter instead of every weight; null: full fine-tuning."
    )
