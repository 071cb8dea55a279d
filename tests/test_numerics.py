"""Subnormal floats flushed to zero (`agentgym_core/numerics.py`)."""

from __future__ import annotations

import ast
import subprocess
import sys
import threading

import pytest
import torch

from agentgym_core.numerics import flushing_now, subnormals_flushed

SCRIPT = """
import threading, torch
from agentgym_core.numerics import flush_subnormals
if {flush}:
    assert flush_subnormals()
results = []
def double():
    results.append(float((torch.tensor([1e-39]) * 2)[0]))
double()  # this thread
thread = threading.Thread(target=double)  # one started after: inherits the flag
thread.start(); thread.join()
print(results)
"""


@pytest.mark.parametrize("flush", [True, False])
def test_a_process_that_flushes_zeroes_subnormals_here_and_in_threads_started_after(flush):
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(flush=flush)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    here, started_after = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    if flush:
        assert here == 0.0 and started_after == 0.0
    else:  # without the flag a subnormal stays one: the test can tell them apart
        assert here == pytest.approx(2e-39, rel=1e-3) and started_after == here


def test_flushing_holds_inside_only_and_in_threads_started_inside():
    assert not flushing_now()  # the test process does not flush (nothing leaks into it)
    seen = []
    with subnormals_flushed():
        assert flushing_now() and float((torch.tensor([1e-39]) * 2)[0]) == 0.0
        thread = threading.Thread(target=lambda: seen.append(flushing_now()))
        thread.start()
        thread.join()
        with subnormals_flushed():  # nested: leaves it on for the outer one
            pass
        assert flushing_now()
    assert seen == [True]
    assert not flushing_now()  # the caller's state is back: Python's floats are IEEE again
    assert sys.float_info.min / 4 > 0.0
