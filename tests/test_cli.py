"""The `agentgym` command line, run as a user would (subprocesses, real plugins, real files)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("agentgym_env_babyai")


def agentgym(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentgym_core.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


def test_plugins_lists_every_installed_component():
    result = agentgym("plugins")
    assert result.returncode == 0, result.stderr
    for kind, name, dist in [
        ("environment", "babyai", "agentgym-env-babyai"),
        ("algorithm", "grpo", "agentgym-algo-grpo"),
        ("scheduler", "scaling_inter", "agentgym-sched-scaling-inter"),
        ("scheduler", "fixed", "agentgym-sched-fixed"),
        ("policy", "hf", "agentgym-core"),
    ]:
        line = next(row for row in result.stdout.splitlines() if f" {name} " in f" {row} ")
        assert kind in line and dist in line and "0.1.0" in line


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "model"
    result = agentgym(
        "model",
        "init",
        "--env",
        "babyai",
        "--env-option",
        "levels=[GoToObj]",
        "--size",
        "hidden_size=32",
        "--size",
        "vocab_size=512",
        "--tasks",
        "30",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    return out


def test_model_init_writes_a_loadable_model_with_env_words(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert AutoModelForCausalLM.from_pretrained(model_dir).config.hidden_size == 32
    assert len(tokenizer.encode(" ball", add_special_tokens=False)) == 1


def _config(tmp_path: Path, model_dir: Path, **extra) -> Path:
    raw = {
        "run": {"name": "cli", "output_dir": str(tmp_path / "run")},
        "model": {"path": str(model_dir)},
        "env": {"name": "babyai", "levels": ["GoToObj"], "list_actions": False},
        "algorithm": {"name": "grpo"},
        "scheduler": {"name": "fixed", "max_turns": 2},
        "rollout": {"max_context_tokens": 512},
        "trainer": {"steps": 2, "tasks_per_step": 2, "group_size": 2},
        "eval": {"num_tasks": 4, "k": 2},
        **extra,
    }
    path = tmp_path / "config.yaml"
    path.write_text("# agentgym train config.yaml\n" + yaml.safe_dump(raw))
    return path


def test_train_pipeline_then_eval(tmp_path, model_dir):
    stages = [{"name": "train", "type": "train"}, {"name": "test", "type": "eval"}]
    config = _config(tmp_path, model_dir, stages=stages)
    result = agentgym("train", str(config), "trainer.steps=2", "--no-progress")
    assert result.returncode == 0, result.stderr
    updates = [line for line in result.stdout.splitlines() if " update " in line]
    assert [line.split(" update ")[1].split()[0] for line in updates] == ["1/2", "2/2"]
    assert "horizon" in updates[0] and "success" in updates[0] and " s" in updates[0]
    checkpoint = tmp_path / "run" / "train" / "checkpoints" / "step-000002"
    assert (checkpoint / "config.json").is_file()
    assert (tmp_path / "run" / "mlflow.db").is_file()
    saved = yaml.safe_load((tmp_path / "run" / "train" / "config.yaml").read_text())
    assert saved["trainer"]["steps"] == 2 and saved["env"]["levels"] == ["GoToObj"]
    assert "avg@2" in result.stdout and "pass@2" in result.stdout

    out = tmp_path / "metrics.json"
    result = agentgym("eval", str(config), f"model.path={checkpoint}", "--json", str(out))
    assert result.returncode == 0, result.stderr
    metrics = json.loads(out.read_text())
    assert 0.0 <= metrics["success_rate"] <= 1.0 and metrics["episodes"] == 8
    assert "GoToObj" in result.stdout


def test_eval_out_keeps_every_episode_for_the_viewer(tmp_path, model_dir):
    config = _config(tmp_path, model_dir)
    out, record = tmp_path / "kept", tmp_path / "metrics.json"
    args = ["eval", str(config), "eval.num_tasks=3", "--out", str(out), "--json", str(record)]
    result = agentgym(*args)
    assert result.returncode == 0, result.stderr
    assert f"agentgym view {out}" in result.stdout and "avg@2" in result.stdout
    assert (out / "mlflow.db").is_file() and not (tmp_path / "run").exists()
    lines = (out / "eval" / "rollouts" / "eval-test.jsonl").read_text().splitlines()
    assert len(lines) == 6 == json.loads(record.read_text())["episodes"]  # 3 tasks x k=2

    from agentgym_core.view.index import EpisodeIndex
    from agentgym_core.view.store import Run

    assert EpisodeIndex(Run(out), cache_dir=tmp_path / "cache").count() == 6
    again = agentgym(*args)  # the same folder again: refused, the first evaluation kept
    assert again.returncode != 0 and "already holds an evaluation" in again.stderr
    assert len((out / "eval" / "rollouts" / "eval-test.jsonl").read_text().splitlines()) == 6


def test_eval_out_refuses_a_comparison_config(tmp_path, model_dir):
    stages = [{"name": "a", "type": "eval"}, {"name": "b", "type": "eval"}]
    out = tmp_path / "kept"
    result = agentgym("eval", str(_config(tmp_path, model_dir, stages=stages)), "--out", str(out))
    assert result.returncode != 0 and "comparison" in result.stderr
    assert not out.exists()


def test_train_quiet_prints_no_update_lines(tmp_path, model_dir):
    config = _config(tmp_path, model_dir)
    result = agentgym("train", str(config), "trainer.steps=1", "--no-progress", "--quiet")
    assert result.returncode == 0, result.stderr
    assert " update " not in result.stdout and "stage " in result.stdout


def test_config_errors_name_the_key_and_exit_2(tmp_path, model_dir):
    config = _config(tmp_path, model_dir)
    result = agentgym("train", str(config), "trainer.steps=-1")
    assert result.returncode == 2 and "trainer.steps" in result.stderr
    result = agentgym("train", str(config), "env.name=babyaii")
    assert result.returncode == 2 and "babyaii" in result.stderr and "babyai" in result.stderr
    result = agentgym("train", str(config), "env.levelz=[GoToObj]")
    assert result.returncode == 2 and "env.levelz" in result.stderr


def test_expert_data_is_agenttraj(tmp_path):
    out = tmp_path / "expert.json"
    result = agentgym(
        "data",
        "expert",
        "babyai",
        "--episodes",
        "6",
        "--env-option",
        "levels=[GoToLocal,PutNextLocal]",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("6 episodes, success 1.00 -> ")  # a count, not 6.0
    items = json.loads(out.read_text())
    assert len(items) == 6 and items[0]["item_id"].startswith("babyai_")
    turns = items[0]["conversations"]
    assert [t["from"] for t in turns[:3]] == ["human", "gpt", "human"]
    assert turns[1] == {"from": "gpt", "loss": False, "value": "Ok."}
    assert all(t["loss"] is True for t in turns[3:] if t["from"] == "gpt")
    assert all(t["loss"] is None for t in turns if t["from"] == "human")
    shared = tmp_path / "shared.json"  # three processes, an env each: the same file
    options = ["--episodes", "6", "--env-option", "levels=[GoToLocal,PutNextLocal]"]
    result = agentgym("data", "expert", "babyai", *options, "--workers", "3", "--out", str(shared))
    assert result.returncode == 0, result.stderr
    assert shared.read_text() == out.read_text()


def test_shipped_eval_config_runs_without_scheduler_or_algorithm(tmp_path, model_dir):
    config = Path(__file__).resolve().parent.parent / "configs" / "babyai-eval.yaml"
    result = agentgym(
        "eval",
        str(config),
        f"model.path={model_dir}",
        f"run.output_dir={tmp_path}",
        "eval.num_tasks=3",
        "eval.k=2",
        "eval.max_turns=2",
        "env.levels=[GoToObj]",
    )
    assert result.returncode == 0, result.stderr
    assert "avg@2" in result.stdout and "GoToObj" in result.stdout


# -- a new user's frictions (issue 31) ---------------------------------------------------


def test_plugins_name_shows_each_option_with_type_default_and_description(capsys):
    from agentgym_core.cli import main

    assert main(["plugins", "grpo"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("algorithm grpo (agentgym-algo-grpo 0.1.0): ")
    assert "  kl_coef: float, default 0.0\n      Weight of the k3 KL" in out
    assert "  std: 'population' | 'sample' | 'none', default population\n" in out
    assert main(["plugins", "fixed"]) == 0
    assert (
        "  max_turns: int, required\n      Turn limit of every episode" in capsys.readouterr().out
    )
    assert main(["plugins", "grpoo"]) == 2
    assert "agentgym: error: no component is named 'grpoo'; installed: " in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        ["serve-env", "babyai", "--port", "1"],
        ["env", "play", "babyai"],
        ["model", "init", "--env", "babyai", "--out", "unused"],
        ["data", "expert", "babyai", "--episodes", "1", "--out", "unused.json"],
    ],
)
def test_o_is_the_env_option_flag_everywhere(command, capsys):
    from agentgym_core.cli import main

    assert main([*command, "-o", "levels=[NoSuchLevel]"]) == 2  # parsed, then validated
    assert "env.levels" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("size", "says"),
    [
        ("hiden_size=32", "--size 'hiden_size=32': unknown key 'hiden_size'; valid keys: "),
        ("hidden_size=abc", "--size: hidden_size: Input should be a valid integer"),
        ("num_heads=3", "--size: hidden_size must be divisible by num_heads"),
    ],
)
def test_a_bad_size_is_one_line(size, says, capsys, tmp_path):
    from agentgym_core.cli import main

    out = tmp_path / "model"
    assert main(["model", "init", "--env", "babyai", "--out", str(out), "--size", size]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"agentgym: error: {says}") and err.count("\n") == 1, err
    if "valid keys" in says:
        assert "hidden_size, num_layers, num_heads" in err
    assert not out.exists()


def test_docs_prints_the_guide_that_ships_in_the_package(capsys):
    from importlib import resources

    from agentgym_core.cli import main

    guide = (resources.files("agentgym_core") / "docs" / "writing-an-env.md").read_text()
    assert main(["docs", "writing-an-env"]) == 0
    assert capsys.readouterr().out == guide
    assert main(["docs"]) == 0
    assert "writing-an-env" in capsys.readouterr().out
    assert main(["docs", "nope"]) == 2
    assert "no guide 'nope'; guides: writing-an-env" in capsys.readouterr().err


def test_a_reader_that_leaves_early_gets_no_traceback():
    reader = subprocess.Popen(
        [sys.executable, "-m", "agentgym_core.cli", "plugins"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    reader.stdout.close()  # as `agentgym plugins | head -0` does
    err = reader.stderr.read().decode()
    assert reader.wait() == 141 and err == ""
