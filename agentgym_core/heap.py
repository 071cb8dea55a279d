"""Giving freed heap memory back to the system after the big allocations of a batch.

PyTorch's CPU tensors come from malloc. glibc maps a block on its own only
above a threshold that rises, after the first large frees, up to 32 MB; below
it, freed tensors stay in an arena and still count as resident. A turn's batch
cache and an update's activations are hundreds of such tensors.
"""

from __future__ import annotations

import ctypes
from typing import Any


def release_freed_memory() -> None:
    """Give the heap's freed pages back to the system (glibc only; elsewhere nothing)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _glibc()
