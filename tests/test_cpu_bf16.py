"""bfloat16 linear layers through float32 kernels (`modeling/cpu_bf16.py`): the same numbers
as a bfloat16 product summed in float32, the same gradients, and a float32 copy of a weight
that follows every change to it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from agentgym_core.modeling.cpu_bf16 import (
    Float32KernelLinear,
    compute_bf16_linears_in_float32,
    has_native_bf16,
)

BF16_STEP = 2.0**-7
"""bfloat16's relative rounding step: one unit in the last place is at most this."""


def _layer(rows: int = 96, cols: int = 64, bias: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(cols, rows, bias=bias).to(torch.bfloat16)
    compute_bf16_linears_in_float32(layer, emulated=True)
    return layer


def _exact(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """The product of the bfloat16 values in float64, rounded to bfloat16 once."""
    bias = None if layer.bias is None else layer.bias.double()
    return nn.functional.linear(x.double(), layer.weight.double(), bias).to(torch.bfloat16)


def _ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference, in bfloat16 steps of the larger magnitude."""
    scale = torch.maximum(a.float().abs(), b.float().abs()).clamp_min(1e-3)
    return float(((a.float() - b.float()).abs() / (scale * BF16_STEP)).max().detach())


@pytest.mark.parametrize(
    ("cpuinfo", "native"),
    [
        ("processor\t: 0\nflags\t\t: fpu sse avx avx2 fma\n", False),
        ("flags\t\t: avx2 avx512f avx512_bf16 avx512_vnni\n", True),
        ("flags\t\t: avx2 amx_bf16 amx_tile\n", True),
        ("processor\t: 0\n", True),  # no flags line: nothing known, left alone
    ],
)
def test_native_bf16_is_read_from_the_cpus_flags(cpuinfo, native):
    assert has_native_bf16(cpuinfo) is native


def test_only_bf16_cpu_linears_are_swapped_and_only_where_bf16_is_emulated():
    model = nn.Sequential(nn.Linear(4, 4).to(torch.bfloat16), nn.Linear(4, 4), nn.ReLU())
    keys = list(model.state_dict())
    assert compute_bf16_linears_in_float32(model, emulated=False) == 0
    assert type(model[0]) is nn.Linear
    assert compute_bf16_linears_in_float32(model, emulated=True) == 1
    assert type(model[0]) is Float32KernelLinear and type(model[1]) is nn.Linear
    assert list(model.state_dict()) == keys


def test_the_output_is_the_bf16_product_rounded_once():
    layer = _layer()
    x = torch.randn(5, 7, 64).to(torch.bfloat16)
    with torch.no_grad():
        ours = layer(x)
        native = nn.functional.linear(x, layer.weight, layer.bias)
    assert ours.dtype == torch.bfloat16 and ours.shape == (5, 7, 96)
    assert _ulps(ours, _exact(x, layer)) <= 1.0  # float32's sum, one rounding
    assert _ulps(ours, native) <= 2.0  # PyTorch's own bfloat16 product, rounded too


def test_gradients_are_the_bf16_products():
    layer = _layer()
    x = torch.randn(6, 64).to(torch.bfloat16).requires_grad_()
    grad = torch.randn(6, 96).to(torch.bfloat16)
    layer(x).backward(grad)
    ours = (x.grad, layer.weight.grad, layer.bias.grad)
    reference = nn.Linear(64, 96).to(torch.bfloat16)
    reference.load_state_dict(layer.state_dict())
    x2 = x.detach().clone().requires_grad_()
    nn.functional.linear(x2, reference.weight, reference.bias).backward(grad)
    theirs = (x2.grad, reference.weight.grad, reference.bias.grad)
    g, w, inputs = grad.double(), layer.weight.double(), x.detach().double()
    exact = (g @ w, g.T @ inputs, g.sum(0))  # summed in float64, rounded to bfloat16 once
    for mine, native, true in zip(ours, theirs, exact, strict=True):
        assert mine.dtype == torch.bfloat16 and mine.shape == native.shape
        assert _ulps(mine, true.to(torch.bfloat16)) <= 1.0
        assert _ulps(mine, native) <= 2.0
    assert layer._wide is None  # a trained weight keeps no copy while it trains


def test_a_frozen_weights_float32_copy_is_kept_and_follows_every_change():
    layer = _layer(bias=False)
    layer.weight.requires_grad_(False)
    x = torch.randn(3, 64).to(torch.bfloat16)
    layer(x)
    kept = layer._wide
    layer(x)
    assert layer._wide is kept  # reused, not converted again
    changes = {
        "in place (version)": lambda w: w.add_(1.0),
        "through .data (no version)": lambda w: w.data.mul_(-0.5),
        "new storage": lambda w: setattr(w, "data", torch.randn_like(w)),
    }
    for name, change in changes.items():
        with torch.no_grad():
            change(layer.weight)
        assert _ulps(layer(x), _exact(x, layer)) <= 1.0, name


def test_autocast_and_float32_inputs_take_nn_linears_own_path():
    layer = _layer()
    x = torch.randn(2, 64)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(layer(x), nn.functional.linear(x, layer.weight, layer.bias))
    assert layer._wide is None


def test_a_compiled_graph_takes_nn_linears_own_path():
    """Under torch.compile the layer keeps no float32 copy: a graph holds no state."""
    layer = _layer()
    x = torch.randn(2, 64).to(torch.bfloat16)
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x), nn.functional.linear(x, layer.weight, layer.bias))
    assert layer._wide is None


def test_lora_wraps_a_swapped_layer_and_trains_its_adapter():
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 8)).to(torch.bfloat16)
    plain = nn.Sequential(nn.Linear(32, 32), nn.Linear(32, 8)).to(torch.bfloat16)
    plain.load_state_dict(model.state_dict())
    compute_bf16_linears_in_float32(model, emulated=True)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["0", "1"], init_lora_weights=False)
    wrapped = peft.get_peft_model(model, config)
    wrapped_plain = peft.get_peft_model(plain, config)
    wrapped_plain.load_state_dict(wrapped.state_dict())
    x = torch.randn(4, 32).to(torch.bfloat16)
    ours, theirs = wrapped(x), wrapped_plain(x)
    assert _ulps(ours, theirs) <= 4.0
    ours.float().sum().backward()
    theirs.float().sum().backward()
    trained = [(n, p) for n, p in wrapped.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n, _ in trained)
    native = dict(wrapped_plain.named_parameters())
    for name, param in trained:
        assert _ulps(param.grad, native[name].grad) <= 8.0, name


@pytest.mark.pretrained
def test_smollm2_in_bf16_through_float32_kernels_is_as_close_to_float32_as_pytorchs_bf16(
    smollm2_dir,
):
    """On the real model, 511 tokens of text: the swapped bfloat16 model's log-probs are as
    near the float32 model's as PyTorch's own bfloat16 products make them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    text = " ".join(
        f"Step {i}: go to the red ball, then open the door on the left." for i in range(60)
    )
    ids = tokenizer(text, return_tensors="pt").input_ids[:, :512]

    def logprobs(model) -> torch.Tensor:
        with torch.no_grad():
            out = model(input_ids=ids).logits.float().log_softmax(-1)
        return out[0, :-1].gather(1, ids[0, 1:, None]).squeeze(1)

    exact = logprobs(AutoModelForCausalLM.from_pretrained(smollm2_dir))
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.bfloat16)
    native = logprobs(model)
    assert compute_bf16_linears_in_float32(model, emulated=True) == 211  # 30 layers x 7, head
    ours = logprobs(model)
    native_error = float((native - exact).abs().mean())
    ours_error = float((ours - exact).abs().mean())
    assert 0 < ours_error <= 1.2 * native_error
