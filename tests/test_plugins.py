"""The plugin host and registry, with inline plugins and the installed entry points."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pluggy
import pytest
from pydantic import BaseModel

from agentgym_core import hookimpl, plugins
from agentgym_core.plugins import BUILTIN_PLUGINS, ENTRY_POINT_GROUP, PluginHost
from agentgym_core.registry import KINDS, Registry, RegistryError
from agentgym_core.types import TrajectoryBatch

pytest_plugins = ["pytester"]


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

    @hookimpl
    def agentgym_register_stage_kinds(self, register):
        register("toy-stage", dict, config=Options)


def _installed() -> list[md.EntryPoint]:
    return sorted(md.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


# -- registration ----------------------------------------------------------------


def test_inline_plugin_registers_each_kind(agentgym_plugin):
    host = agentgym_plugin(Everything(), name="everything")
    expected = {
        "environment": "toy-env",
        "policy": "toy-policy",
        "algorithm": "toy-algo",
        "scheduler": "toy-sched",
        "stage": "toy-stage",
    }
    assert set(expected) == set(KINDS)
    for kind, name in expected.items():
        registration = host.registry.get(kind, name)
        assert registration.kind == kind
        assert (registration.factory, registration.config) == (dict, Options)
        assert (registration.distribution, registration.version) == ("<inline everything>", "0")
        assert name in host.registry.names(kind)
    assert "everything" in host.plugin_names()


def test_duplicate_names_name_both_distributions():
    class Again:
        @hookimpl
        def agentgym_register_environments(self, register):
            register("toy-env", dict, config=Options)

    with pytest.warns(plugins.BrokenPluginWarning, match="registered twice"):
        host = PluginHost({"one": Everything(), "two": Again()}, load_entry_points=False)
    with pytest.raises(RegistryError, match=r"toy-env.*\(<inline one> 0\) and by .*<inline two> 0"):
        host.registry.get("environment", "toy-env")


@pytest.mark.parametrize("installed", PluginHost().registry.all(), ids=lambda r: r.name)
def test_duplicate_of_an_installed_component_names_its_distribution(installed):
    @hookimpl(specname=plugins._REGISTER_HOOKS[installed.kind])
    def register_again(register):
        register(installed.name, dict, config=Options)

    clash = types.ModuleType("clash")
    clash.register_again = register_again
    first = f"{installed.distribution} {installed.version}"
    with pytest.warns(plugins.BrokenPluginWarning, match="registered twice"):
        host = PluginHost({"clash": clash})
    with pytest.raises(
        RegistryError, match=rf"\({first}\) and by plugin 'clash' \(<inline clash> 0\)"
    ):
        host.registry.get(installed.kind, installed.name)


def test_unknown_name_lists_installed():
    host = PluginHost({"everything": Everything()}, load_entry_points=False)
    with pytest.raises(RegistryError, match=r"unknown environment 'nope'; installed: toy-env$"):
        host.registry.get("environment", "nope")
    with pytest.raises(RegistryError, match=r"unknown policy 'nope'; installed: hf, toy-policy"):
        host.registry.get("policy", "nope")


def test_unknown_kind_is_a_registry_error():
    for call in (lambda r: r.get("model", "x"), lambda r: r.names("model")):
        with pytest.raises(RegistryError, match="unknown component kind 'model'"):
            call(Registry())


def test_config_must_be_a_pydantic_model():
    class Bad:
        @hookimpl
        def agentgym_register_algorithms(self, register):
            register("bad", dict, config=dict)

    with pytest.raises(RegistryError, match=r"algorithm 'bad' from <inline bad>.*pydantic"):
        PluginHost({"bad": Bad()}, load_entry_points=False)


def test_a_factory_named_by_module_and_name_is_imported_on_first_use(monkeypatch):
    class Lazy:
        @hookimpl
        def agentgym_register_algorithms(self, register):
            register("lazy", "lazy_factory_module:Made", config=Options)

    module = types.ModuleType("lazy_factory_module")
    module.Made = dict
    host = PluginHost({"lazy": Lazy()}, load_entry_points=False)
    registration = host.registry.get("algorithm", "lazy")
    assert registration.target == "lazy_factory_module:Made"
    with pytest.raises(RegistryError) as missing:  # not importable (yet): the error names it
        _ = registration.factory
    assert str(missing.value).startswith(
        "algorithm 'lazy' from <inline lazy> 0: cannot import its factory "
        "'lazy_factory_module:Made' (ModuleNotFoundError"
    )
    monkeypatch.setitem(sys.modules, "lazy_factory_module", module)
    assert registration.factory is dict
    module.Made = list  # resolved on each use, from the module as it is
    assert registration.factory is list
    del module.Made
    with pytest.raises(RegistryError, match=r"'lazy_factory_module:Made' \(AttributeError"):
        _ = registration.factory


@pytest.mark.parametrize("target", ["no_colon", "module:", ":Name", "module:not a name", 3])
def test_a_factory_must_be_a_callable_or_module_and_name(target):
    class Bad:
        @hookimpl
        def agentgym_register_environments(self, register):
            register("bad", target, config=Options)

    with pytest.raises(RegistryError, match=r"environment 'bad' from <inline bad>: factory "):
        PluginHost({"bad": Bad()}, load_entry_points=False)


def test_loading_every_plugin_imports_no_torch():
    """An env server process, a config that fails validation and `agentgym plugins` load
    every plugin: the algorithms and policies bring torch only when a run builds one."""
    code = """if True:
        import json, sys
        import agentgym_core.cli
        from agentgym_core.config.errors import ConfigError
        from agentgym_core.config.load import load_config
        from agentgym_core.plugins import PluginHost
        from agentgym_core.serve import build_app
        host = PluginHost()
        try:
            load_config("configs/babyai-demo.yaml", ["algorithm.kl_cof=0.01"], host.registry)
        except ConfigError as error:
            message = str(error)
        build_app(host.registry, "babyai", {})
        heavy = lambda: [m for m in ("torch", "transformers") if m in sys.modules]
        loaded = heavy()
        factories = {}
        for name in ("grpo", "ppo", "sft"):
            factories[name] = host.registry.get("algorithm", name).factory.__name__
        factories["hf"] = host.registry.get("policy", "hf").factory.__name__
        print(json.dumps({"loaded": loaded, "after": heavy(), "factories": factories,
                          "message": message}))
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTGYM_")}
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env, cwd=root
    )
    seen = json.loads(out.stdout)
    assert "algorithm.kl_cof: unknown key (did you mean 'kl_coef'?)" in seen["message"]
    assert seen["loaded"] == [], "loading plugins imported torch or transformers"
    assert seen["factories"] == {"grpo": "GRPO", "ppo": "PPO", "sft": "SFT", "hf": "HFPolicy"}
    assert seen["after"] == ["torch", "transformers"]


# -- loud failures at load -----------------------------------------------------------


def _typo_class():
    class Typo:
        @hookimpl
        def agentgym_register_enviroments(self, register):
            register("x", dict, config=Options)

    return Typo()


def _typo_module():
    module = types.ModuleType("typo_plugin")

    @hookimpl
    def agentgym_register_enviroments(register):
        register("x", dict, config=Options)

    module.agentgym_register_enviroments = agentgym_register_enviroments
    return module


@pytest.mark.parametrize("make", [_typo_class, _typo_module], ids=["class", "module"])
def test_misspelled_hook_fails_check_pending(make):
    with pytest.raises(pluggy.PluginValidationError, match="agentgym_register_enviroments"):
        PluginHost({"typo": make()}, load_entry_points=False)


def test_hook_without_hookimpl_fails_loudly():
    class Forgot:
        def agentgym_after_update(self, step, metrics):
            raise AssertionError("never called")

    with pytest.raises(
        pluggy.PluginValidationError,
        match=r"'forgot' defines \['agentgym_after_update'\] without @agentgym",
    ):
        PluginHost({"forgot": Forgot()}, load_entry_points=False)


def test_two_entry_points_with_one_name_fail(monkeypatch):
    twins = [
        md.EntryPoint("twin", value, ENTRY_POINT_GROUP)
        for value in ("agentgym_core.types", "agentgym_core.registry")
    ]
    monkeypatch.setattr(plugins, "md", types.SimpleNamespace(entry_points=lambda group: twins))
    with pytest.raises(RegistryError, match=r"'twin' is declared twice: by agentgym_core.types"):
        PluginHost()


# -- installed entry points --------------------------------------------------------------


def test_allow_and_block_installed_plugins(monkeypatch):
    names = [ep.name for ep in _installed()]
    if not names:
        pytest.skip("no agentgym plugin is installed")
    monkeypatch.delenv("AGENTGYM_DISABLE_PLUGINS", raising=False)
    monkeypatch.setenv("AGENTGYM_LOAD_PLUGINS", f" {names[0]} ,")
    assert PluginHost().plugin_names() == sorted([*BUILTIN_PLUGINS, names[0]])
    monkeypatch.setenv("AGENTGYM_LOAD_PLUGINS", "")
    assert PluginHost().plugin_names() == sorted(BUILTIN_PLUGINS)
    monkeypatch.delenv("AGENTGYM_LOAD_PLUGINS")
    assert set(names) <= set(PluginHost().plugin_names())
    monkeypatch.setenv("AGENTGYM_DISABLE_PLUGINS", names[0])
    assert PluginHost().plugin_names() == sorted([*BUILTIN_PLUGINS, *names[1:]])
    monkeypatch.setenv("AGENTGYM_LOAD_PLUGINS", ",".join(names))
    assert names[0] not in PluginHost().plugin_names(), "blocking wins over allowing"


def test_installed_plugins_record_their_distribution():
    host = PluginHost()
    for ep in _installed():
        if ep.name in host.plugin_names() and ep.dist is not None:
            assert host.source(ep.name) == (ep.dist.metadata["Name"], ep.dist.version)
    assert host.source(BUILTIN_PLUGINS[0])[0] == "agentgym-core"


def test_inline_plugin_already_installed_registers_once(agentgym_plugin):
    installed = _installed()
    if not installed:
        pytest.skip("no agentgym plugin is installed")
    host = agentgym_plugin(installed[0].load(), name="again")
    assert installed[0].name in host.plugin_names() and "again" not in host.plugin_names()


def test_importing_the_core_loads_no_plugin():
    code = """if True:
        import importlib.metadata as md, json, sys
        import agentgym_core, agentgym_core.hookspecs, agentgym_core.plugins
        import agentgym_core.registry, agentgym_core.testing, agentgym_core.testing.pytest_plugin
        mods = {ep.module for ep in md.entry_points(group="agentgym")}
        mods |= {m.split(".")[0] for m in mods}
        before = sorted(m for m in mods if m in sys.modules)
        agentgym_core.plugins.PluginHost()
        after = sorted(m for m in mods if m in sys.modules)
        print(json.dumps({"mods": sorted(mods), "before": before, "after": after}))
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTGYM_")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    seen = json.loads(out.stdout)
    assert seen["before"] == []
    assert seen["after"] == seen["mods"], "PluginHost() should load every entry point"


# -- lifecycle hooks ---------------------------------------------------------------


def test_lifecycle_hooks_reach_plugins(tmp_path: Path):
    calls = []

    class Recorder:
        @hookimpl
        def agentgym_after_rollout(self, step, batch, metrics):
            calls.append(("rollout", step, batch, dict(metrics)))

        @hookimpl
        def agentgym_after_update(self, step, metrics):
            calls.append(("update", step, dict(metrics)))

        @hookimpl
        def agentgym_after_evaluation(self, step, split, metrics):
            calls.append(("evaluation", step, split, dict(metrics)))

        @hookimpl
        def agentgym_on_checkpoint(self, step, path):
            calls.append(("checkpoint", step, path))

    batch = TrajectoryBatch([])
    host = PluginHost({"recorder": Recorder()}, load_entry_points=False)
    host.after_rollout(3, batch, {"rollout/success_rate": 0.5})
    host.after_update(3, {"train/loss": 1.0})
    host.after_evaluation(4, "test", {"success_rate": 0.25})
    host.on_checkpoint(4, tmp_path)
    assert calls == [
        ("rollout", 3, batch, {"rollout/success_rate": 0.5}),
        ("update", 3, {"train/loss": 1.0}),
        ("evaluation", 4, "test", {"success_rate": 0.25}),
        ("checkpoint", 4, tmp_path),
    ]
    assert calls[0][2] is batch
    host.unregister("recorder")
    host.after_update(5, {})
    assert len(calls) == 4


def test_a_hook_may_take_fewer_arguments():
    steps = []

    class Light:
        @hookimpl
        def agentgym_after_update(self, step):
            steps.append(step)

    PluginHost({"light": Light()}, load_entry_points=False).after_update(7, {"x": 1.0})
    assert steps == [7]


# -- the test kit's fixtures -----------------------------------------------------


def test_agentgym_plugin_fixture_cleans_up_after_a_failing_test(pytester):
    pytester.makepyfile(
        """
        from pydantic import BaseModel
        from agentgym_core import hookimpl

        class Opts(BaseModel):
            pass

        class Mine:
            @hookimpl
            def agentgym_register_environments(self, register):
                register("mine", dict, config=Opts)

        HOSTS = []

        def test_uses_it(agentgym_plugin):
            host = agentgym_plugin(Mine(), name="mine")
            HOSTS.append(host)
            assert host.registry.get("environment", "mine").distribution == "<inline mine>"
            assert "mine" in host.plugin_names()
            raise AssertionError("fails on purpose: teardown must still unregister")

        def test_it_was_unregistered(agentgym_host):
            assert "mine" not in HOSTS[0].plugin_names()
            assert "mine" not in agentgym_host.plugin_names()
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1, failed=1)


def test_agentgym_host_fixture_loads_the_installed_plugins(agentgym_host):
    loaded = agentgym_host.plugin_names()
    assert set(BUILTIN_PLUGINS) <= set(loaded)
    blocked = {n for n in os.environ.get("AGENTGYM_DISABLE_PLUGINS", "").split(",") if n}
    broken = {b.name for b in agentgym_host.broken}
    if "AGENTGYM_LOAD_PLUGINS" not in os.environ:  # agentgym-core's own tests: every plugin
        assert {ep.name for ep in _installed()} - blocked - broken <= set(loaded)


def test_a_host_asked_for_some_plugins_says_why_the_others_are_missing(monkeypatch):
    names = [ep.name for ep in _installed()]
    if len(names) < 2:
        pytest.skip("needs two installed agentgym plugins")
    monkeypatch.delenv("AGENTGYM_LOAD_PLUGINS", raising=False)
    monkeypatch.setenv("AGENTGYM_DISABLE_PLUGINS", names[1])
    host = PluginHost(only=[names[0], names[1]], only_reason="asked for one")
    assert host.plugin_names() == sorted([*BUILTIN_PLUGINS, names[0]])
    assert host.registry.unavailable[names[1]].endswith("AGENTGYM_DISABLE_PLUGINS names it")
    for left_out in names[2:]:
        assert host.registry.unavailable[left_out].endswith("is not loaded: asked for one")
    with pytest.raises(RegistryError, match=r"unknown policy 'nope'; installed: .*; asked for one"):
        host.registry.get("policy", "nope")


def test_options_read_as_people_write_them():
    from typing import Literal

    from pydantic import Field

    from agentgym_core.registry import options

    class Opts(BaseModel):
        """Every shape of field."""

        levels: list[str] | Literal["all"] = Field(["a", "b"], description="Which levels.")
        top: int | None = None
        mode: Literal["x", "y"] = "x"
        needed: float = Field(description="No default.")
        extra: dict[str, int] = Field(default_factory=dict)

    rows = [(o.name, o.type, o.default, o.required, o.description) for o in options(Opts)]
    assert rows == [
        ("levels", "list[str] | 'all'", "[a, b]", False, "Which levels."),
        ("top", "int | None", "null", False, ""),
        ("mode", "'x' | 'y'", "x", False, ""),
        ("needed", "float", "", True, "No default."),
        ("extra", "dict[str, int]", "{}", False, ""),
    ]


def test_the_ini_option_names_the_plugins_the_fixtures_load(pytester):
    if "fixed" not in {ep.name for ep in _installed()}:
        pytest.skip("needs agentgym-sched-fixed")
    pytester.makeini("[pytest]\nagentgym_plugins = fixed\n")
    pytester.makepyfile(
        """
        import pytest

        def test_only_fixed(agentgym_host):
            assert agentgym_host.registry.names("scheduler") == ["fixed"]
            assert agentgym_host.registry.names("environment") == []

        @pytest.mark.agentgym_plugins("all")
        def test_all(agentgym_host):
            assert len(agentgym_host.plugin_names()) > 3
        """
    )
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_tiny_model_dir_fixture_loads_offline(tiny_model_dir):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Your goal: go to the red ball."}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), model.config.vocab_size)


def _registers_env(name: str):
    module = types.ModuleType(f"registers_{name}")

    @hookimpl
    def agentgym_register_environments(register):
        register("twin", dict, config=Options)
        register(f"only-{name}", dict, config=Options)

    module.agentgym_register_environments = agentgym_register_environments
    return module


def test_two_plugins_registering_one_name_refuse_only_that_name_and_say_how_to_choose(
    capsys, monkeypatch
):
    """Only a lookup of the clashing name fails, naming both plugins and how to leave one
    out; everything else loads, and `agentgym plugins` lists it and says what is not used."""
    with pytest.warns(plugins.BrokenPluginWarning, match="'twin' is registered twice"):
        host = PluginHost(
            {"first": _registers_env("a"), "second": _registers_env("b")},
            load_entry_points=False,
        )
    with pytest.raises(RegistryError) as error:
        host.registry.get("environment", "twin")
    assert "plugin 'first'" in str(error.value) and "plugin 'second'" in str(error.value)
    assert "AGENTGYM_DISABLE_PLUGINS=first or AGENTGYM_DISABLE_PLUGINS=second" in str(error.value)
    assert host.registry.get("environment", "only-a") and host.registry.get("environment", "only-b")
    from agentgym_core import cli

    monkeypatch.setattr(cli, "plugin_host", lambda: host)
    assert cli.main(["plugins"]) == 0
    listed = capsys.readouterr().out
    assert "only-a" in listed and "only-b" in listed
    assert "not used: environment 'twin' is registered twice" in listed
