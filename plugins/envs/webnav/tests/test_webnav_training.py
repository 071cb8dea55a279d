"""webnav in the pipeline: a two-update GRPO run on a tiny model, and expert data for SFT."""

from __future__ import annotations

import json
import math

import torch
import yaml
from transformers import AutoModelForCausalLM

from agentgym_core.cli import main as agentgym

TASKS = ["click-link", "click-button"]
"""One click ends the episode, right or wrong: a random policy wins some groups and loses others."""
INSTRUCTION = "Click the element the task names."
ENV = {"name": "webnav", "tasks": TASKS, "instruction": INSTRUCTION}
TINY_MODEL = {"corpus_tasks": 8, "corpus_turns": 2, "vocab_size": 400}


def test_two_grpo_updates_on_real_pages(agentgym_train, chromium):
    raw = {
        "run": {"name": "webnav-smoke", "seed": 1},
        "env": ENV,
        "algorithm": {"name": "grpo"},
        "scheduler": {"name": "fixed", "max_turns": 2},
        "rollout": {"max_context_tokens": 1536, "concurrency": 2, "env_threads": 2},
        "trainer": {
            "steps": 2,
            "tasks_per_step": 2,
            "group_size": 4,
            "lr": 1e-3,
            "checkpoint_every": 0,
        },
    }
    run = agentgym_train(raw, tiny_model=TINY_MODEL)

    assert len(run.history) == 2
    for metrics in run.history:
        assert metrics["rollout/episodes"] == 8 and metrics["rollout/env_errors"] == 0
        assert 1 <= metrics["rollout/turns_mean"] <= 2
        assert set(TASKS) <= {k.split("/")[2] for k in metrics if k.startswith("rollout/group/")}
        assert math.isfinite(metrics["train/loss"])
    wins = [m["rollout/success_rate"] for m in run.history]
    assert any(0 < w < 1 for w in wins), wins  # mixed outcomes: GRPO had a signal
    assert any(m["train/grad_norm"] > 0 for m in run.history)
    before = AutoModelForCausalLM.from_pretrained(run.model_dir).state_dict()
    after = AutoModelForCausalLM.from_pretrained(run.checkpoint).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_expert_data_command_writes_successful_agenttraj(tmp_path, chromium, capsys):
    out = tmp_path / "webnav-expert.json"
    code = agentgym(
        [
            "data",
            "expert",
            "webnav",
            "--episodes",
            "4",
            "--split",
            "test",
            "--env-option",
            "tasks=[login-user, use-autocomplete]",
            "--out",
            str(out),
        ]
    )
    assert code == 0 and "success 1.00" in capsys.readouterr().out
    items = json.loads(out.read_text())
    assert [item["item_id"] for item in items] == [
        f"webnav_{t}" for t in range(2_000_000, 2_000_004)
    ]
    for item in items:
        turns = item["conversations"]
        assert turns[0]["value"].startswith("You are a web agent.")
        actions = [t["value"] for t in turns if t["loss"] is True]
        assert len(actions) >= 2  # typing (and a suggestion to click), then submit
        assert actions[-1].startswith("click [")
        assert all(a.split(" ")[0] in ("click", "type") for a in actions)


def test_a_terminated_run_leaves_no_browser_behind(tmp_path, agentgym_tiny_model, chromium):
    """SIGTERM (what `kill`, `timeout` and job schedulers send) closes every Chromium first."""
    import signal
    import subprocess
    import sys
    import time

    import psutil

    raw = {
        "run": {"name": "webnav-killed", "output_dir": str(tmp_path / "run"), "seed": 1},
        "model": {"path": str(agentgym_tiny_model(ENV, **TINY_MODEL))},
        "env": ENV,
        "algorithm": {"name": "grpo"},
        "scheduler": {"name": "fixed", "max_turns": 2},
        "rollout": {"max_context_tokens": 1536, "concurrency": 4, "env_threads": 4},
        "trainer": {"steps": 500, "tasks_per_step": 2, "group_size": 4},
    }
    path = tmp_path / "webnav.yaml"
    path.write_text(yaml.safe_dump(raw))
    command = [sys.executable, "-m", "agentgym_core.cli", "train", str(path), "--no-progress"]
    run = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    parent = psutil.Process(run.pid)
    deadline = time.monotonic() + 120
    browsers: list[psutil.Process] = []
    while len(browsers) < 4:  # wait until the rollout has its browsers open
        assert run.poll() is None and time.monotonic() < deadline, run.stderr.read()
        time.sleep(0.5)
        browsers = _named_descendants(parent, "chrom")
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=60) == 143
    gone, alive = psutil.wait_procs(browsers, timeout=10)
    assert not alive, [(p.pid, p.name()) for p in alive]


def _named_descendants(parent, fragment: str) -> list:
    """Descendants whose name holds `fragment`; one that exits while listed is skipped."""
    import psutil

    found = []
    for process in parent.children(recursive=True):
        try:
            if fragment in process.name():
                found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found
