"""`benchmarks/repeat_check.py`: a tiny SFT run repeats at one commit; a moved bit is caught."""

from __future__ import annotations

import shutil
import sqlite3
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.repeat_check import compare, train_and_evaluate  # noqa: E402

INSTRUCTION = "Reach the goal with one action per turn."


@pytest.fixture(scope="module")
def config(tmp_path_factory) -> Path:
    from agentgym_env_babyai import BabyAIConfig, BabyAIEnv

    from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model

    folder = tmp_path_factory.mktemp("repeat")
    env = BabyAIEnv(BabyAIConfig(levels=["GoToObj"], list_actions=False, instruction=INSTRUCTION))
    model = init_model(
        env_corpus(env, env.tasks("train")[:40], max_turns=4),
        folder / "model",
        TinyModelConfig(vocab_size=400),
    )
    raw = {
        "run": {"name": "repeat", "output_dir": str(folder / "unused"), "seed": 0},
        "model": {"path": str(model)},
        "env": {"name": "babyai", "levels": ["GoToObj"], "list_actions": False},
        "algorithm": {"name": "sft", "expert": {"episodes": 12, "max_turns": 6}, "batch_size": 4},
        "trainer": {"steps": 3, "lr": 3e-3, "checkpoint_every": 3},
        "eval": {"num_tasks": 8, "max_turns": 6},
        "tracking": {"log_trajectories": 0, "traces": False},
    }
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_run_repeats_and_a_change_anywhere_is_caught(config, tmp_path):
    runs = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        runs[name] = train_and_evaluate(str(config), [], [], tmp_path / name)
    same = compare(runs["a"], runs["b"])
    assert [row[0] for row in same][:1] == ["expert.json"]  # the stage's data is compared
    assert all(row[3] for row in same), same

    # the second run again, one bit of each kind moved: data, a logged loss, a weight, a score
    moved = dict(runs["b"], out=tmp_path / "moved" / "run", store=tmp_path / "moved.db")
    shutil.copytree(runs["b"]["out"], moved["out"])
    shutil.copy(runs["b"]["store"], moved["store"])
    moved["checkpoint"] = moved["out"] / runs["b"]["checkpoint"].relative_to(runs["b"]["out"])
    expert = moved["out"] / "expert.json"
    expert.write_text(expert.read_text().replace("go to", "go  to", 1))
    with sqlite3.connect(moved["store"]) as db:
        db.execute("UPDATE metrics SET value = value + 1e-6 WHERE key = 'train/loss' AND step = 2")
    weights = load_file(moved["checkpoint"] / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1e-7
    save_file(weights, moved["checkpoint"] / "model.safetensors")
    moved["eval"] = dict(runs["b"]["eval"], success_rate=runs["b"]["eval"]["success_rate"] + 0.125)
    verdicts = {row[0]: row[3] for row in compare(runs["a"], moved)}
    assert not any(verdicts.values()), verdicts
