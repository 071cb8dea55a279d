"""The devices a test runs on: the CPU always, a CUDA GPU under `make test-gpu`."""

from __future__ import annotations

import pytest
import torch

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        ],
    ),
]
"""For `pytest.mark.parametrize("device", DEVICES)`."""
