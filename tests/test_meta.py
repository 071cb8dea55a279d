"""Meta-tests: every hook is documented in docs/hooks.md and exercised by some test."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from agentgym_core import hookspecs

ROOT = Path(__file__).resolve().parent.parent
HOOKS = sorted(
    (name, fn) for name, fn in vars(hookspecs).items()
    if name.startswith("agentgym_") and callable(fn)
)


def _section(doc: str, hook: str) -> str:
    match = re.search(rf"^### `{hook}\((.*?)\)`\n(.*?)(?=^#|\Z)", doc, re.S | re.M)
    assert match, f"docs/hooks.md has no section for {hook}"
    return match.group(0)


def test_there_are_hooks():
    assert len(HOOKS) >= 8


@pytest.mark.parametrize(("name", "fn"), HOOKS, ids=[name for name, _ in HOOKS])
def test_hook_is_documented(name, fn):
    section = _section((ROOT / "docs" / "hooks.md").read_text(), name)
    params = list(inspect.signature(fn).parameters)
    signature = re.match(rf"### `{name}\((.*?)\)`", section).group(1)
    assert [p.strip() for p in signature.split(",")] == params
    for param in params:
        assert f"`{param}" in section or f"{param}(" in section or param in section


@pytest.mark.parametrize(("name", "fn"), HOOKS, ids=[name for name, _ in HOOKS])
def test_hookspec_docstring_names_every_argument(name, fn):
    doc = inspect.getdoc(fn) or ""
    assert "Args:" in doc, f"{name} docstring lacks an Args: section"
    for param in inspect.signature(fn).parameters:
        assert re.search(rf"^\s+{param}:", doc, re.M), f"{name}: Args does not name {param}"


@pytest.mark.parametrize(("name", "fn"), HOOKS, ids=[name for name, _ in HOOKS])
def test_hook_has_a_test(name, fn):
    sources = [p for p in (ROOT / "tests").rglob("test_*.py") if p.name != "test_meta.py"]
    sources += list((ROOT / "plugins").glob("*/*/tests/test_*.py"))
    assert any(name in p.read_text() for p in sources), f"no test mentions {name}"
