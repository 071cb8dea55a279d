"""The plugin host and registry with inline plugins and the installed entry points."""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys
from pathlib import Path

import pluggy
import pytest
from pydantic import BaseModel

from agentgym_core import hookimpl
from agentgym_core.plugins import ENTRY_POINT_GROUP, PluginHost
from agentgym_core.registry import RegistryError
from agentgym_core.types import TrajectoryBatch


class Options(BaseModel):
    size: int = 1


class Everything:
    """An inline plugin registering one component of each kind."""

    @hookimpl
    def agentgym_register_environments(self, register):
        register("toy-env", dict, config=Options)

    @hookimpl
    def agentgym_register_policies(self, register):
        register("toy-policy", dict, config=Options)

    @hookimpl
    def agentgym_register_algorithms(self, register):
        register("toy-algo", dict, config=Options)

    @hookimpl
    def agentgym_register_schedulers(self, register):
        register("toy-sched", dict, config=Options)


def test_inline_plugin_registers_each_kind(agentgym_plugin):
    host = agentgym_plugin(Everything(), name="everything")
    for kind, name in [("environment", "toy-env"), ("policy", "toy-policy"),
                       ("algorithm", "toy-algo"), ("scheduler", "toy-sched")]:
        registration = host.registry.get(kind, name)
        assert registration.config is Options
        assert registration.distribution == "<inline everything>"


def test_duplicate_names_name_both_distributions():
    class Again:
        @hookimpl
        def agentgym_register_environments(self, register):
            register("toy-env", dict, config=Options)

    with pytest.raises(RegistryError, match=r"toy-env.*<inline one>.*<inline two>"):
        PluginHost({"one": Everything(), "two": Again()}, load_entry_points=False)


def test_unknown_name_lists_installed():
    host = PluginHost({"everything": Everything()}, load_entry_points=False)
    with pytest.raises(RegistryError, match=r"unknown environment 'nope'; installed: toy-env"):
        host.registry.get("environment", "nope")


def test_config_must_be_a_pydantic_model():
    class Bad:
        @hookimpl
        def agentgym_register_algorithms(self, register):
            register("bad", dict, config=dict)

    with pytest.raises(RegistryError, match="pydantic"):
        PluginHost({"bad": Bad()}, load_entry_points=False)


def test_misspelled_hook_fails_loudly():
    class Typo:
        @hookimpl
        def agentgym_register_enviroments(self, register):
            register("x", dict, config=Options)

    with pytest.raises(pluggy.PluginValidationError, match="agentgym_register_enviroments"):
        PluginHost({"typo": Typo()}, load_entry_points=False)


def _installed() -> list[str]:
    return sorted(ep.name for ep in md.entry_points(group=ENTRY_POINT_GROUP))


def test_allow_and_block_installed_plugins(monkeypatch):
    names = _installed()
    if len(names) < 2:
        pytest.skip("needs two installed plugins")
    monkeypatch.setenv("AGENTGYM_LOAD_PLUGINS", names[0])
    assert names[0] in PluginHost().plugin_names() and names[1] not in PluginHost().plugin_names()
    monkeypatch.delenv("AGENTGYM_LOAD_PLUGINS")
    monkeypatch.setenv("AGENTGYM_DISABLE_PLUGINS", names[0])
    loaded = PluginHost().plugin_names()
    assert names[0] not in loaded and names[1] in loaded
    monkeypatch.setenv("AGENTGYM_LOAD_PLUGINS", "")
    monkeypatch.delenv("AGENTGYM_DISABLE_PLUGINS")
    assert PluginHost().plugin_names() == ["agentgym_core.policies.builtin"]


def test_importing_the_core_loads_no_plugin():
    code = (
        "import sys, agentgym_core, agentgym_core.plugins, agentgym_core.hookspecs;"
        "print(sorted(m for m in sys.modules if m.startswith('agentgym_') and"
        " not m.startswith('agentgym_core')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_lifecycle_hooks_reach_plugins(tmp_path: Path):
    calls = []

    class Recorder:
        @hookimpl
        def agentgym_after_rollout(self, step, batch, metrics):
            calls.append(("rollout", step, len(batch), dict(metrics)))

        @hookimpl
        def agentgym_after_update(self, step, metrics):
            calls.append(("update", step, dict(metrics)))

        @hookimpl
        def agentgym_after_evaluation(self, step, split, metrics):
            calls.append(("evaluation", step, split, dict(metrics)))

        @hookimpl
        def agentgym_on_checkpoint(self, step, path):
            calls.append(("checkpoint", step, path))

    host = PluginHost({"recorder": Recorder()}, load_entry_points=False)
    host.after_rollout(3, TrajectoryBatch([]), {"rollout/success_rate": 0.5})
    host.after_update(3, {"train/loss": 1.0})
    host.after_evaluation(4, "test", {"success_rate": 0.25})
    host.on_checkpoint(4, tmp_path)
    assert calls == [
        ("rollout", 3, 0, {"rollout/success_rate": 0.5}),
        ("update", 3, {"train/loss": 1.0}),
        ("evaluation", 4, "test", {"success_rate": 0.25}),
        ("checkpoint", 4, tmp_path),
    ]
    host.unregister("recorder")
    host.after_update(5, {})
    assert len(calls) == 4
