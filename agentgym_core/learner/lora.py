"""LoRA through PEFT: an adapter trained on a frozen base, its reference and its weights.

`model.lora` wraps the stage's starting model with a fresh adapter (`add_adapter`).
Only the adapter trains. The KL reference is the same model with the adapter
turned off (`AdapterOff`): no second copy of the weights. A checkpoint holds
the adapter and the path of its base (`adapter_config.json`); loading such a
checkpoint merges the adapter into its base (`merged_checkpoint`), so the next
stage, an evaluation or `agentgym model merge` sees plain weights. A chain of
LoRA stages works the same way: each stage's base is the previous stage's
merged weights, so the reference is always the weights the stage started from.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from agentgym_core.modeling.text_config import text_config

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def is_adapter(model: Any) -> bool:
    """Whether `model` is a PEFT model (an adapter on a base)."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def is_adapter_checkpoint(folder: str | Path) -> bool:
    """Whether a checkpoint folder holds an adapter rather than whole weights."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def adapter_base(folder: str | Path) -> Path:
    """The base an adapter checkpoint was trained on (as its `adapter_config.json` names it)."""
    config = json.loads((Path(folder) / ADAPTER_CONFIG).read_text())
    base = config.get("base_model_name_or_path")
    if not base:
        raise ValueError(f"{folder}/{ADAPTER_CONFIG} names no base model")
    return Path(base)


def add_adapter(model: Any, options: Any, *, base_path: str | Path) -> Any:
    """`model` wrapped with a fresh adapter as `options` (a `model.lora` block) describe.

    By default the adapter's weights stay in float32 on a lower-precision base
    (PEFT's autocast), so they need no master copies. `adapter_dtype: model`
    keeps them in the base's dtype instead: no casts around each adapted layer,
    and the learner steps their float32 masters (`precision`).
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=options.r,
        lora_alpha=options.alpha,
        lora_dropout=options.dropout,
        target_modules=_targets(model, options),
        bias=options.bias,
        modules_to_save=options.modules_to_save,
        use_rslora=options.use_rslora,
        layers_to_transform=_top_layers(model, options.top_layers),
        task_type="CAUSAL_LM",
    )
    autocast = options.adapter_dtype == "float32"
    wrapped = get_peft_model(model, config, autocast_adapter_dtype=autocast)
    wrapped.peft_config["default"].base_model_name_or_path = str(Path(base_path).resolve())
    return wrapped


def _targets(model: Any, options: Any) -> Any:
    """`target_modules` as PEFT takes them.

    With `top_layers`, `all-linear` is spelled out as the linear layers' names (the
    output head's aside): PEFT takes no layer list beside a pattern.
    """
    if options.top_layers is None or options.target_modules != "all-linear":
        return options.target_modules
    head = model.get_output_embeddings()
    return sorted(
        {
            name.rsplit(".", 1)[-1]
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and module is not head
        }
    )


def decoder_depth(model: Any) -> int | None:
    """How many decoder layers the model has (its config's `num_hidden_layers`), if it says."""
    return getattr(text_config(model), "num_hidden_layers", None)


def _top_layers(model: Any, top: int | None) -> list[int] | None:
    """The indices of the last `top` decoder layers (None: every layer)."""
    if top is None:
        return None
    depth = decoder_depth(model)
    if depth is None or top > depth:
        raise ValueError(f"top_layers={top}, but the model has {depth} decoder layers")
    return list(range(depth - top, depth))


def with_adapter_from(model: Any, checkpoint: str | Path) -> Any:
    """`model` (an adapter checkpoint's base) wrapped with that checkpoint's adapter."""
    from peft import PeftModel

    return PeftModel.from_pretrained(model, str(checkpoint))


def load_adapter_weights(model: Any, checkpoint: str | Path) -> None:
    """Put a checkpoint's adapter weights into `model`'s adapter (resume)."""
    from peft.utils import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, load_file_weights(checkpoint))
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"{checkpoint}: adapter weights this model has no place for: {unexpected}")


def load_file_weights(checkpoint: str | Path) -> dict[str, torch.Tensor]:
    """An adapter checkpoint's own weights, as saved."""
    from safetensors.torch import load_file

    return load_file(str(Path(checkpoint) / ADAPTER_WEIGHTS))


def merged(model: Any) -> Any:
    """A PEFT model's adapter merged into its base: a plain transformers model."""
    return model.merge_and_unload() if is_adapter(model) else model


def full_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The weights as the plain model has them: an adapter's update merged in, names unwrapped.

    For weight syncs to an engine that serves whole models (vLLM). The model is
    not changed: each merged tensor is W + (its adapter's delta), computed anew.
    """
    if not is_adapter(model):
        yield from model.state_dict().items()
        return
    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        get_delta = getattr(module, "get_delta_weight", None)
        if get_delta is not None and hasattr(module, "base_layer"):
            active = module.active_adapters[0]
            deltas[f"{name}.base_layer.weight"] = get_delta(active)
    for name, tensor in base.state_dict().items():
        if ".lora_" in name or ".original_module." in name:
            continue  # adapter factors (merged below) and the frozen copies of trained modules
        weight = tensor + deltas[name].to(tensor.dtype) if name in deltas else tensor
        name = re.sub(r"\.modules_to_save\.[^.]+\.", ".", name.replace(".base_layer.", "."))
        yield name, weight


def backbone(model: Any) -> Any:
    """The transformer body under the LM head (`base_model`), through a PEFT wrapper."""
    inner = model.get_base_model() if is_adapter(model) else model
    return inner.base_model


class AdapterOff:
    """The frozen reference of a LoRA run: the same model, adapter turned off.

    Quacks like the model where the learner uses a reference (a forward call,
    `parameters()` for its device); it never changes the shared weights'
    training flags.
    """

    def __init__(self, model: Any) -> None:
        self.model = model

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The base model's forward pass."""
        with self.model.disable_adapter():
            return self.model(*args, **kwargs)

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        """The shared model's parameters."""
        return self.model.parameters()

    def get_base_model(self) -> Any:
        """The base under the adapter (the forward pass takes its arguments)."""
        return self.model.get_base_model()

    def eval(self) -> AdapterOff:
        """Nothing to do: the learner sets the shared model's mode itself."""
        return self

    def requires_grad_(self, requires_grad: bool = True) -> AdapterOff:
        """Nothing to do: the base is frozen, and the adapter must keep training."""
        return self
