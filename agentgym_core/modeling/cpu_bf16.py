"""bfloat16 linear layers computed by float32 kernels, on CPUs without bfloat16 instructions.

An x86 CPU without avx512_bf16 or AMX (an AMD EPYC before Zen 4, most laptops)
has no bfloat16 dot product, and PyTorch's bfloat16 matrix products there are
emulated: on a 2-core AMD EPYC, SmolLM2 ran 3x (a decode step) to 26x (a LoRA
update) slower in bfloat16 than in float32 (`benchmarks/cpu_bf16.py`). A
bfloat16 product is the products of bfloat16 numbers summed in float32 and
rounded to bfloat16 once; converting both operands to float32 and running the
float32 kernel computes the same numbers (up to the order of the sum, which
differs between kernels anyway). So `model.dtype: bfloat16` keeps its meaning
(bfloat16 weights and activations, the same memory) at nearly float32's speed.

`compute_bf16_linears_in_float32` swaps the class of each bfloat16 `nn.Linear`
on such a CPU; the weights, their names and the state dict stay as they are, and
PEFT's adapters wrap the swapped layers as they wrap any `nn.Linear`.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

NATIVE_FLAGS = ("avx512_bf16", "amx_bf16")
"""x86 CPU flags (Linux's /proc/cpuinfo names) of bfloat16 dot-product instructions."""


def has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bfloat16 in hardware (True where it cannot be told)."""
    if cpuinfo is None:
        if platform.machine().lower() not in ("x86_64", "amd64"):
            return True  # ARM's and Apple's paths are not known to be emulated: left alone
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return True
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            return any(flag in flags for flag in NATIVE_FLAGS)
    return True


@functools.cache
def bf16_is_emulated() -> bool:
    """This machine's CPU has no bfloat16 instructions (read once)."""
    return not has_native_bf16()


class _Float32Product(torch.autograd.Function):
    """`F.linear` of bfloat16 tensors through float32 kernels.

    Keeps the bfloat16 input for the backward pass, as the bfloat16 product would.
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias, wide_weight: torch.Tensor):
        ctx.save_for_backward(x, wide_weight)
        ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
        wide_bias = None if bias is None else bias.float()
        return F.linear(x.float(), wide_weight, wide_bias).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        x, wide_weight = ctx.saved_tensors
        weight_dtype, bias_dtype = ctx.dtypes
        wide = grad.float()
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = (wide @ wide_weight).to(x.dtype)
        rows = wide.reshape(-1, wide.shape[-1])
        if ctx.needs_input_grad[1]:
            grad_weight = (rows.T @ x.reshape(-1, x.shape[-1]).float()).to(weight_dtype)
        if bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_bias = rows.sum(dim=0).to(bias_dtype)
        return grad_x, grad_weight, grad_bias, None


class Float32KernelLinear(nn.Linear):
    """An `nn.Linear` whose bfloat16 products on the CPU run through float32 kernels.

    The weight's float32 copy is kept between calls (converting 135M weights at every
    decoded token took about a third of the step in a profile) and made again when the
    weight changes: its version (an optimizer step, `copy_`), its storage, or any of `SAMPLED`
    evenly spaced values (a write through `.data`, as PEFT's merge does, leaves the
    version as it was). A forward pass that trains the weight converts it afresh: its
    products are large beside the conversion.
    """

    SAMPLED = 64
    _wide: torch.Tensor | None = None
    _wide_of: tuple[int, int, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`nn.Linear`'s output; bfloat16 CPU inputs through the float32 kernels."""
        if (
            x.dtype != torch.bfloat16
            or self.weight.dtype != torch.bfloat16
            or x.device.type != "cpu"
            or torch.is_autocast_enabled("cpu")
            or torch.compiler.is_compiling()  # a compiled graph keeps no state between calls
        ):
            return super().forward(x)
        return _Float32Product.apply(x, self.weight, self.bias, self._wide_weight())

    def _wide_weight(self) -> torch.Tensor:
        weight = self.weight.detach()
        flat = weight.reshape(-1)
        sample = flat[:: max(1, flat.numel() // self.SAMPLED)]
        kept = self._wide_of
        if (
            self._wide is not None
            and kept[:2] == (weight.data_ptr(), self.weight._version)
            and torch.equal(kept[2], sample)
        ):
            return self._wide
        wide = weight.float()
        if not (torch.is_grad_enabled() and self.weight.requires_grad):
            self._wide = wide
            self._wide_of = (weight.data_ptr(), self.weight._version, sample.clone())
        return wide


def compute_bf16_linears_in_float32(model: nn.Module, *, emulated: bool | None = None) -> int:
    """Swap each bfloat16 CPU `nn.Linear` of `model` to `Float32KernelLinear`.

    Only where the CPU has no bfloat16 instructions (`emulated`: that fact, for
    tests); returns how many layers were swapped.
    """
    if not (bf16_is_emulated() if emulated is None else emulated):
        return 0
    swapped = 0
    for module in model.modules():
        if (
            type(module) is nn.Linear
            and module.weight.dtype == torch.bfloat16
            and module.weight.device.type == "cpu"
        ):
            module.__class__ = Float32KernelLinear
            swapped += 1
    return swapped
