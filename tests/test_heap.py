"""`release_freed_memory`: freed tensors glibc kept in its arena leave the resident set.

The learner calls it after every update and the `hf` policy after every batch;
`benchmarks/heap_release.py` measures what that keeps off the resident set.
"""

from __future__ import annotations

import pytest
import torch

from agentgym_core import heap

pytestmark = pytest.mark.skipif(heap._LIBC is None, reason="glibc's malloc_trim only")


def _resident_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


def test_freed_tensors_below_the_mapping_threshold_are_given_back():
    big = torch.ones(2**22)  # 16 MB, mapped on its own; freeing it raises glibc's threshold
    del big
    blocks = [torch.ones(2**19) for _ in range(100)]  # 200 MB of 2 MB tensors, now in the arena
    pin = torch.ones(2**19)  # above them, so the arena's top cannot simply shrink
    del blocks
    kept = _resident_mb()
    heap.release_freed_memory()
    assert kept - _resident_mb() > 150
    del pin
