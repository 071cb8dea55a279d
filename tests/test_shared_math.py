"""Shared maths of the plugin API against values worked out by hand."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from agentgym_core import api
from agentgym_core.types import Trajectory, Turn


def test_group_normalize_population_and_sample_std_differ():
    # [1, 2, 3]: mean 2, deviations -1, 0, 1, squares sum to 2
    # population std sqrt(2 / 3) -> -+sqrt(3 / 2); sample std sqrt(2 / 2) = 1 -> -+1
    values = [1.0, 2.0, 3.0]
    population = api.group_normalize(values, std="population", eps=0.0)
    sample = api.group_normalize(values, std="sample", eps=0.0)
    assert population == pytest.approx([-math.sqrt(1.5), 0.0, math.sqrt(1.5)])
    assert sample == [-1.0, 0.0, 1.0]
    assert api.group_normalize(values, std="none", eps=0.0) == [-1.0, 0.0, 1.0]


def test_group_normalize_eps_and_small_groups():
    # [1, 0, 0, 1]: mean 0.5, population std 0.5 -> +-0.5 / (0.5 + 0.5) = +-0.5 with eps 0.5
    assert api.group_normalize([1.0, 0.0, 0.0, 1.0], std="population", eps=0.5) == [
        0.5,
        -0.5,
        -0.5,
        0.5,
    ]
    assert api.group_normalize([0.7], std="population", eps=1e-6) == [0.0]
    assert api.group_normalize([0.7], std="sample", eps=1e-6) == [0.0]  # no sample std of one
    assert api.group_normalize([], std="sample", eps=1e-6) == []
    with pytest.raises(ValueError, match="std must be"):
        api.group_normalize([1.0, 2.0], std="n-1", eps=1e-6)  # type: ignore[arg-type]


def _trajectory(mask: list[int], turns: int) -> Trajectory:
    n = len(mask)
    return Trajectory(
        task_id=3,
        group=0,
        token_ids=list(range(n)),
        loss_mask=mask,
        logprobs=[0.0] * n,
        turns=[Turn(f"a{k}", "o", 0.0) for k in range(turns)],
    )


def test_turn_spans_by_hand():
    # prompt 0-1, turn 0 at 2-3, observation 4, turn 1 at 5, observations 6-7, turn 2 at 8
    t = _trajectory([0, 0, 1, 1, 0, 1, 0, 0, 1], turns=3)
    assert api.turn_spans(t) == [(2, 4), (5, 6), (8, 9)]
    assert api.turn_spans(_trajectory([0, 1, 1, 0], turns=1)) == [(1, 3)]
    assert api.turn_spans(_trajectory([0, 0], turns=0)) == []


def test_turn_spans_need_one_run_per_turn():
    with pytest.raises(ValueError, match="task 3: 1 runs of sampled tokens for 2 turns"):
        api.turn_spans(_trajectory([0, 1, 1, 1], turns=2))


def test_seeded_task_ids_by_hand():
    # 3 kinds, seed-major: seed 0 -> 0, 1, 2; seed 1 -> 3, 4, 5
    assert api.seeded_task_ids("train", kinds=3, train_seeds=2, test_seeds=5) == [0, 1, 2, 3, 4, 5]
    # test seeds from 1,000,000: ids 3,000,000 + kind, then 3,000,003 + kind
    assert api.seeded_task_ids("test", kinds=3, train_seeds=2, test_seeds=2) == [
        3_000_000,
        3_000_001,
        3_000_002,
        3_000_003,
        3_000_004,
        3_000_005,
    ]
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        api.seeded_task_ids("dev", kinds=3, train_seeds=2, test_seeds=2)


def test_seeded_task_decodes_ids():
    assert api.seeded_task(4, kinds=3) == api.SeededTask(kind=1, seed=1, split="train")
    assert api.seeded_task(3_000_005, kinds=3) == (2, 1_000_001, "test")
    for split in ("train", "test"):
        ids = api.seeded_task_ids(split, kinds=4, train_seeds=3, test_seeds=3)
        assert {api.seeded_task(i, kinds=4).split for i in ids} == {split}
        assert len({api.seeded_task(i, kinds=4)[:2] for i in ids}) == len(ids) == 12


def test_the_task_grid_loads_no_torch():
    """Environment plugins use it through the API without loading torch."""
    code = (
        "import sys, json; from agentgym_core.api import seeded_task, seeded_task_ids; "
        "print(json.dumps([m for m in ('torch', 'transformers') if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
