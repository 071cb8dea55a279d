"""Subnormal floats flushed to zero on the CPU while agentgym trains or generates.

A trained model's peaked softmaxes make many subnormal numbers (below about 1.2e-38),
and x86 cores compute with them far more slowly than with normal ones: a BabyAI
moonshot SFT run's updates slowed from 153 s to 220-257 s per hundred over its 600
steps, on the same data; an update of its final checkpoint took 1.44x as long without
flush-to-zero as with it, its start model's 1.04x (`benchmarks/denormals.py`). XLA
flushes them on CPUs by default too; the values lost are below what float32 training
can tell from zero.

The flag is processor state of a thread (Python's own float arithmetic obeys it too),
and threads inherit it when they start. So a stage holds it only while it runs
(`subnormals_flushed`) and gives the caller's thread back its state; torch's pool
threads and the rollout threads started meanwhile keep it. A process of agentgym's
own (the rollout worker, the demo, the results harness) sets it once at its start
(`flush_subnormals`), before torch starts its threads. GPUs are unaffected.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


def flush_subnormals() -> bool:
    """Flush for this thread and those it starts; False where the CPU cannot."""
    import torch

    return torch.set_flush_denormal(True)


def flushing_now() -> bool:
    """Whether this thread flushes subnormals now (a subnormal halved comes out zero)."""
    smallest_normal = sys.float_info.min
    return smallest_normal / 4 == 0.0


@contextlib.contextmanager
def subnormals_flushed() -> Iterator[None]:
    """Flush while inside (and in threads started inside); then this thread's state as before."""
    import torch

    before = flushing_now()
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(before)
