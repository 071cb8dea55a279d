"""Float32 master copies of trained weights held in bfloat16 (or float16).

`model.dtype: bfloat16` keeps the model in bfloat16: the rollout, scoring and
the loss all run on the same bfloat16 weights, so the sampler and the learner
see one model. An update of a bfloat16 weight would lose most small steps to
rounding, so the optimizer steps float32 copies instead and the model takes
their rounded values after each step (mixed precision with master weights, as
DeepSpeed's and Megatron's bf16 optimizers do). Memory per trained weight: 2
bytes of weight, 2 of gradient, 4 of master and 8 of AdamW state. A LoRA
adapter on a bfloat16 base is float32 already (PEFT keeps it so) and needs no
copy, unless `model.lora.adapter_dtype: model` keeps it in bfloat16 too; the
frozen base costs 2 bytes per weight.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

LOW_PRECISION = (torch.bfloat16, torch.float16)


class MasterWeights:
    """The float32 masters of a module's low-precision trainable parameters."""

    def __init__(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        self.pairs: list[tuple[torch.nn.Parameter, torch.nn.Parameter]] = [
            (p, torch.nn.Parameter(p.detach().float().clone()))
            for p in parameters
            if p.requires_grad and p.dtype in LOW_PRECISION
        ]
        self._master_of = {id(p): master for p, master in self.pairs}

    def optimized(self, parameters: Iterable[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
        """What the optimizer steps: each trainable parameter, or its master when it has one."""
        return [self._master_of.get(id(p), p) for p in parameters if p.requires_grad]

    def gradients_to_masters(self) -> None:
        """Move each low-precision gradient onto its master, in float32."""
        for p, master in self.pairs:
            master.grad = None if p.grad is None else p.grad.float()
            p.grad = None

    @torch.no_grad()
    def masters_to_model(self) -> None:
        """Round the stepped masters into the model's weights."""
        for p, master in self.pairs:
            p.copy_(master)

    def bytes(self) -> int:
        """Memory the masters take."""
        return sum(master.numel() * master.element_size() for _, master in self.pairs)

    def state(self) -> list[torch.Tensor]:
        """The masters' values, for a checkpoint (the model's are only their rounding)."""
        return [master.detach().cpu().clone() for _, master in self.pairs]

    @torch.no_grad()
    def load_state(self, state: list[Any]) -> None:
        """Inverse of `state`; the model takes the masters' rounding."""
        if len(state) != len(self.pairs):
            raise ValueError(
                f"the checkpoint holds {len(state)} float32 master weights, this model needs "
                f"{len(self.pairs)}: resume with the same model.dtype it was trained with"
            )
        for (_, master), saved in zip(self.pairs, state, strict=True):
            master.copy_(saved)
        self.masters_to_model()
