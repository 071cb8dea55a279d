"""`agentgym` with accelerate's FSDP2 on CPU ranks, for tests: accelerate enables FSDP on GPUs.

Launch it as the CLI: `accelerate launch --use_fsdp --fsdp_version 2 ... tests/fsdp_cpu.py
train cfg.yaml`. On CPU accelerate's state stays MULTI_CPU; this marks it FSDP once the
learner's Accelerator made it, so the model is sharded with torch's FSDP2, which runs
on CPU over gloo. Nothing else changes: the code under test is the GPU path.
"""

from __future__ import annotations

import sys

from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType

_init = AcceleratorState.__init__


def _init_as_fsdp(self, *args, fsdp_plugin=None, **kwargs):
    _init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
    if fsdp_plugin is not None:
        self.distributed_type = DistributedType.FSDP
        self.fsdp_plugin = fsdp_plugin


AcceleratorState.__init__ = _init_as_fsdp

if __name__ == "__main__":
    from agentgym_core.cli import main

    sys.exit(main())
