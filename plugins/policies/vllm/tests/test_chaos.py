"""The chaos run's smoke mode (benchmarks/chaos.py --smoke), in `make test-vllm`.

Three env servers, two vLLM replicas and two learner ranks train for three
minutes while an env server and a replica, in turn, are killed (SIGKILL or
SIGTERM) every 8-15 s and restarted. What must hold: training goes on through every kill, no env id
is left open on a server, every replica's probe after a sync matches the
learner's, every update's sampled log-probs are the learner's, and the run's
figures, with an evaluation of its newest checkpoint, are written.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed here; `make test-vllm` builds .venv-vllm and runs these"
)
pytest.importorskip("agentgym_env_remote")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

CHAOS = Path(__file__).resolve().parents[4] / "benchmarks" / "chaos.py"


def test_training_survives_servers_and_replicas_killed_and_restarted(tmp_path):
    done = subprocess.run(
        [sys.executable, str(CHAOS), "--smoke", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-5000:]
    figures = json.loads((tmp_path / "chaos.json").read_text())
    kills = figures["kills"]
    assert figures["kills_total"] >= 2 and not figures["restart_failures"], figures
    assert any(kills[f"env-{i}"] for i in range(3)), kills  # both kinds were hit
    assert any(kills[f"replica-{i}"] for i in range(2)), kills
    assert figures["updates"] >= 5, figures
    assert set(figures["env_ids_left_open"].values()) == {0}, figures
    assert figures["probe_gap_max"] < 1e-3, figures
    assert figures["updates_sampled_on_stale_weights"] == 0, figures
    assert figures["sampler_logprob_diff_max"] < 1e-3, figures
    evaluation = figures["eval"]  # the newest checkpoint, on 20 test tasks
    assert not evaluation["partial"] and evaluation["episodes"] == 20, evaluation
