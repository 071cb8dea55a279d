"""One broken installed plugin: one warning line everywhere, an error only where it is named.

The broken plugins here are real installed distributions as far as Python can
tell: a `.dist-info` folder with an `entry_points.txt`, on a folder put on the
path of a subprocess running the real `agentgym` command (or of this process).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentgym_core.plugins import BrokenPluginWarning, PluginHost
from agentgym_core.registry import RegistryError

pytest.importorskip("agentgym_env_babyai")

FOO_LINE = (
    "plugin 'foo' (agentgym-env-foo 0.1, entry point foo = agentgym_env_foo.plugin) failed to "
    "load: ModuleNotFoundError: No module named 'agentgym_env_foo' (fix or uninstall "
    "agentgym-env-foo, or skip it: AGENTGYM_DISABLE_PLUGINS=foo)"
)


def install(site: Path, distribution: str, entry_points: dict[str, str], **modules: str) -> None:
    """A distribution as pip leaves it: metadata, entry points, and the given module files."""
    info = site / f"{distribution.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
    lines = [f"{name} = {value}" for name, value in entry_points.items()]
    (info / "entry_points.txt").write_text("[agentgym]\n" + "\n".join(lines) + "\n")
    for module, source in modules.items():
        (site / f"{module}.py").write_text(textwrap.dedent(source))


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A folder holding agentgym-env-foo, whose entry point names a module that is not there."""
    site = tmp_path / "site"
    install(site, "agentgym-env-foo", {"foo": "agentgym_env_foo.plugin"})
    return site


def agentgym(site: Path, *args: str, cwd: Path | None = None, **env: str):
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTGYM_", "PYTEST_"))}
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-m", "agentgym_core.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=environ,
        timeout=600,
    )


def test_plugins_lists_the_others_and_says_one_line(site):
    result = agentgym(site, "plugins")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [f"agentgym: warning: {FOO_LINE}"]
    assert " babyai " in result.stdout and " grpo " in result.stdout


def test_disabling_it_silences_the_warning(site):
    result = agentgym(site, "plugins", AGENTGYM_DISABLE_PLUGINS="foo")
    assert result.returncode == 0 and result.stderr == ""


def test_a_command_or_config_naming_it_fails_with_that_line(site, tmp_path):
    played = agentgym(site, "env", "play", "foo")
    assert played.returncode == 2
    assert f"agentgym: error: environment 'foo' is not available: {FOO_LINE}" in played.stderr
    assert "Traceback" not in played.stderr
    config = tmp_path / "foo.yaml"
    config.write_text(
        "model: {path: unused}\nenv: {name: foo}\nalgorithm: {name: grpo}\n"
        "scheduler: {name: fixed, max_turns: 2}\n"
    )
    trained = agentgym(site, "train", str(config))
    assert trained.returncode == 2 and "Traceback" not in trained.stderr
    assert f"env.name: environment 'foo' is not available: {FOO_LINE}" in trained.stderr


def test_training_another_env_runs_with_the_warning(site, tmp_path):
    config = tmp_path / "babyai-grpo.yaml"
    model = tmp_path / "model"
    made = agentgym(
        site, "model", "init", "--env", "babyai", "-o", "levels=[GoToObj]", "--tasks", "20",
        "--size", "hidden_size=32", "--out", str(model),
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert f"agentgym: warning: {FOO_LINE}" in made.stderr
    written = agentgym(
        site, "config", "init", "--env", "babyai", "--algorithm", "grpo", "--scheduler", "fixed",
        "--out", str(config), "scheduler.max_turns=3", "env.levels=[GoToObj]",
        f"model.path={model}", f"run.output_dir={tmp_path / 'run'}",
    )  # fmt: skip
    assert written.returncode == 0, written.stderr
    command = config.read_text().splitlines()[0]
    assert command == f"# agentgym train {config}"  # the file opens with the command that runs it
    small = ["trainer.steps=1", "trainer.tasks_per_step=2", "trainer.group_size=2"]
    trained = agentgym(site, *command.split()[2:], *small, "--no-progress")
    assert trained.returncode == 0, trained.stderr
    assert f"agentgym: warning: {FOO_LINE}" in trained.stderr and "Traceback" not in trained.stderr
    assert (tmp_path / "run" / "checkpoints" / "step-000001").is_dir()


def test_a_registration_hook_that_raises_is_skipped_too(tmp_path, monkeypatch):
    site = tmp_path / "site"
    install(
        site,
        "agentgym-env-bar",
        {"bar": "agentgym_env_bar_plugin"},
        agentgym_env_bar_plugin="""
            from agentgym_core.api import hookimpl

            @hookimpl
            def agentgym_register_environments(register):
                from pydantic import BaseModel
                register("bar", dict, config=BaseModel)

            @hookimpl
            def agentgym_register_schedulers(register):
                import agentgym_no_such_dependency  # the scheduler's own dependency is missing
            """,
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("AGENTGYM_LOAD_PLUGINS", "bar,fixed")
    with pytest.warns(BrokenPluginWarning) as warned:
        host = PluginHost()
    line = (
        "plugin 'bar' (agentgym-env-bar 0.1, entry point bar = agentgym_env_bar_plugin) failed "
        "to load: agentgym_register_schedulers raised ModuleNotFoundError: No module named "
        "'agentgym_no_such_dependency'"
    )
    assert [str(w.message) for w in warned] == [
        f"{line} (fix or uninstall agentgym-env-bar, or skip it: AGENTGYM_DISABLE_PLUGINS=bar)"
    ]
    assert [b.name for b in host.broken] == ["bar"] and "bar" not in host.plugin_names()
    assert host.registry.names("scheduler") == ["fixed"]
    assert host.registry.names("environment") == [], "its other registrations are dropped"
    with pytest.raises(
        RegistryError, match=f"environment 'bar' is not available: {re.escape(line)}"
    ):
        host.registry.get("environment", "bar")
    with pytest.raises(RegistryError, match=r"unknown environment 'baz'.*failed to load: bar"):
        host.registry.get("environment", "baz")


def test_a_misspelled_hook_in_an_installed_plugin_is_skipped(tmp_path, monkeypatch):
    site = tmp_path / "site"
    install(
        site,
        "agentgym-env-typo",
        {"typo": "agentgym_env_typo_plugin"},
        agentgym_env_typo_plugin="""
            from agentgym_core.api import hookimpl

            @hookimpl
            def agentgym_register_enviroments(register):
                pass
            """,
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("AGENTGYM_LOAD_PLUGINS", "typo")
    with pytest.warns(BrokenPluginWarning, match=r"unknown hooks \['agentgym_register_enviroments"):
        host = PluginHost()
    assert [b.name for b in host.broken] == ["typo"]


# -- the test kit: a plugin's tests load only that plugin -----------------------------------


PLUGIN_TESTS = """
import pytest

def test_the_host_holds_the_plugin_under_test_only(agentgym_host):
    assert agentgym_host.registry.names("environment") == ["mine"]
    assert agentgym_host.registry.names("algorithm") == []

@pytest.mark.agentgym_plugins("fixed")
def test_a_marker_adds_a_plugin(agentgym_host):
    assert agentgym_host.registry.names("scheduler") == ["fixed"]

def test_a_plugin_left_out_says_how_to_add_it(agentgym_host):
    with pytest.raises(Exception) as caught:
        agentgym_host.registry.get("algorithm", "grpo")
    text = str(caught.value)
    assert "algorithm 'grpo' is not available: plugin 'grpo' (agentgym-algo-grpo" in text
    assert "the test loads only the plugin under test and what it asks for (mine)" in text
    assert '@pytest.mark.agentgym_plugins("NAME")' in text

def test_agentgym_plugin_is_narrow_too(agentgym_plugin):
    host = agentgym_plugin(object(), name="nothing")
    assert host.registry.names("environment") == ["mine"]
"""

MINE = """
    from pydantic import BaseModel
    from agentgym_core.api import hookimpl

    class MineConfig(BaseModel):
        pass

    @hookimpl
    def agentgym_register_environments(register):
        register("mine", dict, config=MineConfig)
    """


def test_a_plugins_tests_pass_beside_a_broken_plugin(site, tmp_path):
    install(
        site,
        "agentgym-env-mine",
        {"mine": "agentgym_env_mine_plugin"},
        agentgym_env_mine_plugin=MINE,
    )
    project = tmp_path / "agentgym-env-mine"
    (project / "tests").mkdir(parents=True)
    (project / "pyproject.toml").write_text(
        '[project]\nname = "agentgym-env-mine"\nversion = "0.1"\n\n'
        '[project.entry-points.agentgym]\nmine = "agentgym_env_mine_plugin"\n'
    )
    (project / "tests" / "test_mine.py").write_text(PLUGIN_TESTS)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTGYM_", "PYTEST_"))}
    environ["PYTHONPATH"] = str(site)
    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    strict = ["-W", "error::agentgym_core.plugins.BrokenPluginWarning"]  # foo is never loaded
    done = subprocess.run([*run, *strict], cwd=project, env=environ, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 passed" in done.stdout
    # a folder that declares no plugin (as agentgym-core's own tests) gets every installed one:
    # the broken plugin is skipped with its warning, and the test passes
    loose = tmp_path / "loose"
    loose.mkdir()
    (loose / "pyproject.toml").write_text('[project]\nname = "loose"\nversion = "0"\n')
    (loose / "test_all.py").write_text(
        "def test_every_plugin(agentgym_host):\n"
        "    assert {'mine', 'babyai'} <= set(agentgym_host.registry.names('environment'))\n"
        "    assert [b.name for b in agentgym_host.broken] == ['foo']\n"
    )
    done = subprocess.run(run, cwd=loose, env=environ, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout and "BrokenPluginWarning" in done.stdout
