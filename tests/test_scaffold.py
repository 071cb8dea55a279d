"""`agentgym new env`: the package it writes installs, lists, and passes its own tests."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from agentgym_core.cli import main
from agentgym_core.scaffold import ScaffoldError, check_name, core_requirement, new_env

NAME = "guess_num"


@pytest.mark.parametrize("name", ["Foo", "1st", "my-env", "class", "_x", "", "é"])
def test_a_name_must_be_a_lowercase_identifier(name):
    with pytest.raises(ScaffoldError, match="must be a lowercase Python identifier"):
        check_name(name)


def test_the_cli_refuses_a_bad_name_and_a_non_empty_folder(tmp_path, capsys):
    assert main(["new", "env", "Guess", "--out", str(tmp_path / "a")]) == 2
    assert "env name 'Guess' must be a lowercase Python identifier" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "keep.txt").write_text("mine")
    assert main(["new", "env", NAME, "--out", str(tmp_path / "b")]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["keep.txt"]
    (tmp_path / "c").write_text("a file")
    with pytest.raises(ScaffoldError, match="is not a folder"):
        new_env(NAME, tmp_path / "c")


def test_an_empty_folder_is_filled(tmp_path, capsys):
    (tmp_path / "pkg").mkdir()
    assert main(["new", "env", NAME, "--out", str(tmp_path / "pkg")]) == 0
    package = tmp_path / "pkg" / f"agentgym_env_{NAME}"
    assert sorted(p.name for p in package.iterdir()) == [
        "__init__.py",
        "config.py",
        "env.py",
        "plugin.py",
    ]
    pyproject = (tmp_path / "pkg" / "pyproject.toml").read_text()
    assert 'name = "agentgym-env-guess-num"' in pyproject
    assert f'{NAME} = "agentgym_env_{NAME}.plugin"' in pyproject
    assert f'dependencies = ["{core_requirement()}"]' in pyproject
    assert "class GuessNumEnv:" in (package / "env.py").read_text()
    hint = capsys.readouterr().out
    assert f"pip install -e '{tmp_path / 'pkg'}[test]'" in hint  # [test]: pytest, for its tests
    assert "agentgym docs writing-an-env" in hint
    readme = (tmp_path / "pkg" / "README.md").read_text()
    assert "pip install -e '.[test]'" in readme and "agentgym docs writing-an-env" in readme
    assert "docs/writing-an-env.md" not in readme, "the repository's docs are in no wheel"
    assert 'test = ["pytest' in pyproject


@pytest.mark.parametrize(
    ("version", "pin"),
    [("0.1.0", "agentgym-core>=0.1,<0.2"), ("0.12.3", "agentgym-core>=0.12,<0.13"),
     ("1.2.0", "agentgym-core>=1.2,<2")],
)  # fmt: skip
def test_core_requirement_pins_the_api_version(version, pin):
    assert core_requirement(version) == pin


def _throwaway_venv(path: Path) -> Path:
    """A venv that sees this one's packages (agentgym-core, pytest, pip, setuptools) below its own.

    `--system-site-packages` shows the base interpreter's packages, not this
    venv's, so a .pth file adds this venv's site-packages (processing its
    editable installs' .pth files too).
    """
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(path)],
        check=True,
    )
    python = path / "bin" / "python"
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    own = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    ours = sysconfig.get_paths()["purelib"]
    Path(own.stdout.strip(), "agentgym-project.pth").write_text(
        f"import site; site.addsitedir({ours!r})\n"
    )
    return python


def test_the_generated_package_installs_lists_and_passes_its_tests(tmp_path):
    out = tmp_path / f"agentgym-env-{NAME}"
    new_env(NAME, out)
    python = _throwaway_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTGYM_", "PYTEST_"))}
    env["PYTHONWARNINGS"] = "ignore::UserWarning"  # setuptools' "Editable installation" notice

    def run(*args: str | Path, cwd: Path = tmp_path) -> str:
        done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    pip = (python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation")
    run(*pip, "-e", out)
    tests = run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=out)
    assert " passed" in tests and "failed" not in tests and "skipped" not in tests
    listed = run(python, "-m", "agentgym_core.cli", "plugins").splitlines()
    row = next(line.split() for line in listed if f" {NAME} " in line)
    assert row == ["environment", NAME, "agentgym-env-guess-num", "0.1.0"]
    ruff = Path(sys.executable).parent / "ruff"
    if ruff.exists():  # the package is lint-clean under its own ruff settings
        run(ruff, "check", "--no-cache", ".", cwd=out)
        run(ruff, "format", "--no-cache", "--check", ".", cwd=out)
    shutil.rmtree(tmp_path / "venv")


GUIDE = Path(__file__).resolve().parent.parent / "agentgym_core" / "docs" / "writing-an-env.md"


def test_the_env_guide_ships_in_the_package_and_docs_points_there():
    stub = (GUIDE.parents[2] / "docs" / "writing-an-env.md").read_text()
    assert "(../agentgym_core/docs/writing-an-env.md)" in stub
    assert "agentgym docs writing-an-env" in stub
    guide = GUIDE.read_text()
    assert "pip install -e 'agentgym-env-guess[test]'" in guide
    assert "](" not in guide, "a link in the guide leads nowhere when `agentgym docs` prints it"


def test_the_env_guide_quotes_the_scaffold(tmp_path):
    """Every Python and TOML sample of the env guide is in `agentgym new env guess`."""
    doc = GUIDE.read_text()
    blocks = re.findall(r"^```(?:python|toml)\n(.*?)^```$", doc, re.M | re.S)
    written = "\n".join(p.read_text() for p in new_env("guess", tmp_path / "guess"))
    assert len(blocks) >= 8
    for block in blocks:
        assert block in written, f"not in the scaffold's output:\n{block}"


def test_the_guide_is_package_data_of_the_core_wheel():
    import tomllib

    root = GUIDE.parents[2]
    data = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = data["package-data"]["agentgym_core"]
    shipped = {p for pattern in patterns for p in (root / "agentgym_core").glob(pattern)}
    assert GUIDE in shipped
