"""`agentgym config init`: a starter config that loads as written, so nobody needs `configs/`."""

from __future__ import annotations

import re

import pytest
import yaml

from agentgym_core.cli import build_parser, main
from agentgym_core.config.load import load_config
from agentgym_core.plugins import PluginHost
from agentgym_core.registry import options

pytest.importorskip("agentgym_env_babyai")
pytest.importorskip("agentgym_algo_grpo")
pytest.importorskip("agentgym_sched_fixed")

HOST = PluginHost()
BLOCKS = {"env": "environment", "algorithm": "algorithm", "scheduler": "scheduler"}


def init(out, *extra: str, env="babyai", algorithm="grpo", scheduler="fixed") -> int:
    names = ["--env", env, "--algorithm", algorithm, "--scheduler", scheduler]
    return main(["config", "init", *names, "--out", str(out), *extra])


def test_written_config_loads_opens_with_its_command_and_lists_every_option(tmp_path, capsys):
    out = tmp_path / "babyai-grpo.yaml"
    assert init(out, "scheduler.max_turns=8", "env.levels=[GoToObj]") == 0
    assert f"agentgym train {out}" in capsys.readouterr().out
    text = out.read_text()
    assert text.splitlines()[0] == f"# agentgym train {out}"
    resolved = load_config(out, [], HOST.registry)  # as `agentgym train` loads it
    assert resolved.root.env.name == "babyai" and resolved.root.model.path
    assert resolved.components["scheduler"][1].max_turns == 8
    assert resolved.components["env"][1].levels == ["GoToObj"]
    for block, kind in BLOCKS.items():
        registration = HOST.registry.get(kind, resolved.raw[block]["name"])
        for option in options(registration.config):
            assert f"  {option.name}: " in text or f"  # {option.name}: " in text, option.name
            assert option.description.split()[0] in text
    uncommented = re.sub(r"(?m)^  # (\w+): ", r"  \1: ", text)  # every option uncommented
    commented = yaml.safe_load(uncommented)
    assert commented["algorithm"]["kl_coef"] == resolved.components["algorithm"][1].kl_coef


@pytest.mark.parametrize("env", HOST.registry.names("environment"))
def test_every_installed_env_gets_a_config_or_is_told_what_to_add(env, tmp_path, capsys):
    out = tmp_path / f"{env}.yaml"
    code = init(out, "scheduler.max_turns=4", env=env)
    err = capsys.readouterr().err
    required = [o for o in options(HOST.registry.get("environment", env).config) if o.required]
    if not required:
        assert code == 0, err
        load_config(out, [], HOST.registry)
        return
    assert code == 2 and not out.exists()
    for option in required:
        assert f"env.{option.name}: missing required key: add env.{option.name}=<" in err


def test_a_missing_required_option_says_how_to_give_it_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "c.yaml"
    assert init(out) == 2
    err = capsys.readouterr().err
    assert err.startswith("agentgym: error: invalid config in the starter config (1 problem):")
    assert "scheduler.max_turns: missing required key: add scheduler.max_turns=<int> (Turn " in err
    assert not out.exists()


def test_mistakes_are_named_and_nothing_is_written(tmp_path, capsys):
    out = tmp_path / "c.yaml"
    assert init(out, "scheduler.max_turns=4", "env.levls=[GoToObj]") == 2
    assert "env.levls: unknown key (did you mean 'levels'?)" in capsys.readouterr().err
    assert init(out, "scheduler.max_turns=4", algorithm="grpoo") == 2
    assert "unknown algorithm 'grpoo'; installed:" in capsys.readouterr().err
    assert init(out, "max_turns=4") == 2
    assert "expected block.key=value, got 'max_turns=4'" in capsys.readouterr().err
    assert not out.exists()
    out.write_text("mine")
    assert init(out, "scheduler.max_turns=4") == 2
    assert "exists; give --out a new file" in capsys.readouterr().err
    assert out.read_text() == "mine"


def test_help_no_longer_points_at_the_repositorys_configs():
    help_text = build_parser().format_help()
    assert "configs/" not in help_text and "agentgym config init" in help_text
