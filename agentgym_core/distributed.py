"""Ranks under `accelerate launch`: who writes, how work is split, how results are combined.

Every rank runs the same program on the same data: the tasks of step t derive
from (run.seed, t), so all ranks agree on the episode list without talking.
Work that splits (episodes, the trajectories of a mini-batch) is split by a
pure function of that data; results are gathered so that every rank holds the
whole batch again, and advantages and metrics are those of the full batch.
Files, tracking and printing belong to the main process.

With one process every function here is a no-op (`gather` returns its input,
`sum_over_ranks` its argument), so single-process runs take the same code path.
The process group is accelerate's (`PartialState`), shared with the learner's
`Accelerator`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


def _state() -> Any:
    """The process state of accelerate (imported late: importing this module stays cheap)."""
    import torch
    from accelerate import PartialState

    # as the learner's Accelerator: without a GPU, ranks are CPU processes over gloo
    return PartialState(cpu=not torch.cuda.is_available())


def device() -> torch.device:
    """The device this rank's models and tensors go to: the one accelerate assigns it.

    Under `accelerate launch` on GPUs, `cuda:<local rank>`; one process on a GPU
    machine, `cuda`; without a GPU (also with `LOCAL_RANK` set by a CPU launch),
    `cpu`. The learner's `Accelerator` places the trained model on the same
    device, so everything a run places by hand agrees with it. Nothing else in
    the package names a device.
    """
    return _state().device


def rank() -> int:
    """This process's index among all processes (0 without `accelerate launch`)."""
    return _state().process_index


def world_size() -> int:
    """Number of processes (1 without `accelerate launch`)."""
    return _state().num_processes


def is_main() -> bool:
    """True on the process that writes files, tracks, prints and calls observation hooks."""
    return _state().is_main_process


def wait() -> None:
    """Block until every rank gets here (nothing to wait for with one process)."""
    if world_size() > 1:
        _state().wait_for_everyone()


def _gather_lists(local: list[Any]) -> list[Any]:
    from accelerate.utils import gather_object

    return list(gather_object(local))


def chunk(items: Sequence[T], index: int, count: int) -> list[T]:
    """Part `index` of `count` contiguous, near-equal parts (earlier parts take the remainder)."""
    size, extra = divmod(len(items), count)
    start = index * size + min(index, extra)
    return list(items[start : start + size + (index < extra)])


def shard(items: Sequence[T]) -> list[T]:
    """This rank's contiguous part of `items`; `gather` of the parts restores `items`."""
    return chunk(items, rank(), world_size())


def gather(local: Sequence[T]) -> list[T]:
    """Every rank's `local` list, concatenated in rank order, on every rank (a collective)."""
    if world_size() == 1:
        return list(local)
    return _gather_lists(list(local))


def split_by_tokens(lengths: Sequence[int], count: int) -> list[list[int]]:
    """Indices of `lengths` in `count` parts of near-equal token sums, each in ascending order.

    Longest first, each to the lightest part so far (ties: the lower part); a
    pure function of `lengths`, so every rank computes the same split.
    """
    parts: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for index in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        lightest = min(range(count), key=lambda p: (loads[p], p))
        parts[lightest].append(index)
        loads[lightest] += lengths[index]
    return [sorted(part) for part in parts]


def sum_over_ranks(values: Mapping[str, float]) -> dict[str, float]:
    """Sum of each key's value over all ranks (a key missing on a rank counts 0)."""
    if world_size() == 1:
        return dict(values)
    total: dict[str, float] = {}
    for part in _gather_lists([dict(values)]):
        for key, value in part.items():
            total[key] = total.get(key, 0.0) + value
    return total


def max_over_ranks(value: int) -> int:
    """The largest `value` of all ranks."""
    if world_size() == 1:
        return value
    return max(_gather_lists([value]))


def weights_on_main_only() -> bool:
    """True when transformers loads real weights on (local) rank 0 only: FSDP's RAM-saving load.

    With `fsdp_cpu_ram_efficient_loading` (accelerate's default for FSDP) every
    other rank's `from_pretrained` holds zeros until FSDP broadcasts the prepared
    model; models that are not prepared (a reference, an eval model) would keep them.
    """
    flags = ("ACCELERATE_USE_FSDP", "FSDP_CPU_RAM_EFFICIENT_LOADING")
    return world_size() > 1 and all(os.environ.get(f, "").lower() in ("1", "true") for f in flags)


def share_main_weights(module: torch.nn.Module) -> None:
    """Give every rank the main process's weights and buffers, where only it loaded them."""
    if not weights_on_main_only():
        return
    import torch.distributed as dist

    for tensor in [*module.parameters(), *module.buffers()]:
        dist.broadcast(tensor.data, src=0)


def pad_to_busiest(work: Sequence[T], spare: Callable[[], T]) -> list[tuple[T, float]]:
    """This rank's work items with weight 1, then weight-0 `spare()` up to the busiest rank's count.

    Every rank then runs equally many forward and backward passes, so the
    collectives inside them (DDP's gradient reduction, FSDP's gathers) pair up;
    a weight-0 pass adds nothing to the gradient. A collective itself.
    """
    plan = [(item, 1.0) for item in work]
    missing = max_over_ranks(len(plan)) - len(plan)
    if missing:
        plan += [(spare(), 0.0)] * missing
    return plan


def fingerprint(module: torch.nn.Module) -> list[float]:
    """Float64 sum and sum of squares of every parameter, parameters sorted by name."""
    import torch

    out: list[float] = []
    with torch.no_grad():
        for _, parameter in sorted(module.named_parameters()):
            values = parameter.detach().double()
            out += [float(values.sum()), float((values * values).sum())]
    return out


def same_weights(module: torch.nn.Module, *, step: int) -> dict[str, Any]:
    """Check that every rank holds the same weights; returns each rank's fingerprint.

    A collective. Data-parallel ranks apply identical updates to identical
    weights, so a difference is a bug (or a rank-dependent model): it stops
    the run rather than training on silently diverged replicas.

    Raises:
        RuntimeError: the ranks' fingerprints differ.
    """
    prints = _gather_lists([fingerprint(module)])
    if any(p != prints[0] for p in prints[1:]):
        differ = [r for r, p in enumerate(prints) if p != prints[0]]
        raise RuntimeError(
            f"after {step} updates, ranks {differ} hold weights that differ from rank 0's"
        )
    return {"world_size": len(prints), "fingerprints": prints}


# -- FSDP: full states from sharded ones (each a collective) -----------------------------


def full_model_state(model: torch.nn.Module) -> dict[str, Any]:
    """The unsharded state dict of an FSDP model, on every rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))


def full_optimizer_state(model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """The unsharded optimizer state (keyed by parameter name) on the main process; `{}` else."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(model, optimizer, options=options)


def load_full_optimizer_state(model: torch.nn.Module, optimizer: Any, state: dict) -> None:
    """Shard a full optimizer state (as `full_optimizer_state` made it) into `optimizer`."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(model, optimizer, state, options=options)
