"""The import picture: no cycles, and no arrow from a lower layer up into a higher one.

Every import statement counts, also inside functions and under TYPE_CHECKING:
a lazy import still ties two modules together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "agentgym_core"

NEVER = {
    "agentgym_core.types": ["agentgym_core."],
    "agentgym_core.tasks": ["agentgym_core."],
    "agentgym_core.interfaces": [
        "agentgym_core.data",
        "agentgym_core.learner",
        "agentgym_core.run",
    ],
    "agentgym_core.config": ["agentgym_core.run", "agentgym_core.learner", "agentgym_core.rollout"],
    "agentgym_core.data": ["agentgym_core.run", "agentgym_core.learner"],
    "agentgym_core.rollout": [
        "agentgym_core.run",
        "agentgym_core.learner",
        "agentgym_core.tracking",
        "agentgym_core.policies",
    ],
    "agentgym_core.policies": [
        "agentgym_core.run",
        "agentgym_core.learner",
        "agentgym_core.tracking",
    ],
    "agentgym_core.learner": [
        "agentgym_core.run",
        "agentgym_core.tracking",
        "agentgym_core.config",
        "agentgym_core.rollout",
    ],
    "agentgym_core.tracking": [
        "agentgym_core.run",
        "agentgym_core.learner",
        "agentgym_core.rollout",
    ],
}
"""Module (or package) -> prefixes it must never import: the arrows that would run back up."""


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str) -> set[str]:
    """The agentgym_core modules `module` imports, anywhere in its file."""
    path = MODULES[module]
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            target = _resolve(name) if name.startswith("agentgym_core") else None
            inside = target is not None and module.startswith(target + ".")
            if target and target not in (module, "agentgym_core") and not inside:
                found.add(target)
    return found


GRAPH = {module: _imports(module) for module in MODULES}


def _cycles() -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in GRAPH:
        if v not in index:
            visit(v)
    return out


def test_the_core_has_no_import_cycle():
    assert _cycles() == []


@pytest.mark.parametrize("layer", sorted(NEVER))
def test_no_arrow_runs_back_up(layer):
    banned = [prefix.rstrip(".") for prefix in NEVER[layer]]
    wrong = [
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if module == layer or module.startswith(layer + ".")
        for target in sorted(targets)
        if any(target == p or target.startswith(p + ".") for p in banned)
    ]
    assert not wrong, "\n".join(wrong)


def test_the_checker_sees_a_cycle_and_an_arrow_up(monkeypatch):
    """The checks can fail: a made-up edge from types up to run is both."""
    monkeypatch.setitem(GRAPH, "agentgym_core.types", {"agentgym_core.run.train"})
    assert any("agentgym_core.types" in cycle for cycle in _cycles())
    with pytest.raises(AssertionError, match="types imports agentgym_core.run.train"):
        test_no_arrow_runs_back_up("agentgym_core.types")


MODULE_LINES = 500
"""A core module past this many lines is doing more than one job."""


def _module_lines() -> dict[str, int]:
    return {
        path.relative_to(ROOT.parent).as_posix(): len(path.read_text().splitlines())
        for path in ROOT.rglob("*.py")
    }


def test_no_core_module_grows_past_the_limit(lines=None):
    lines = _module_lines() if lines is None else lines
    wrong = [
        f"{module}: {count} lines (limit {MODULE_LINES})"
        for module, count in sorted(lines.items())
        if count > MODULE_LINES
    ]
    assert not wrong, "split these by job:\n" + "\n".join(wrong)


def test_the_size_check_can_fail():
    with pytest.raises(AssertionError, match="new.py: 501 lines"):
        test_no_core_module_grows_past_the_limit({"agentgym_core/new.py": 501})
    test_no_core_module_grows_past_the_limit({"agentgym_core/new.py": 500})


def _all_imports() -> dict[str, set[str]]:
    """Every module each core module names in an import statement, anywhere in its file."""
    out: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        names = out.setdefault(module, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
    return out


def test_the_core_imports_no_plugin():
    """Plugins depend on the core, never the reverse (a plugin may not be installed)."""
    plugin_packages = ("agentgym_env_", "agentgym_policy_", "agentgym_algo", "agentgym_sched")
    wrong = {
        f"{module} imports {target}"
        for module, targets in _all_imports().items()
        for target in targets
        if target.startswith(plugin_packages)
    }
    assert not wrong, "the core imports a plugin:\n" + "\n".join(sorted(wrong))


def _policy_getattrs(sources: dict[str, str]) -> set[str]:
    """`module: name` for each `getattr(<...policy>, "name", ...)` in the sources given."""
    found = set()
    for module, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr"):
                continue
            target, name = node.args[0], node.args[1] if len(node.args) > 1 else None
            if "policy" in ast.unparse(target) and isinstance(name, ast.Constant):
                found.add(f"{module}: {name.value}")
    return found


def test_every_optional_policy_attribute_the_core_reads_is_declared(sources=None):
    """A policy attribute read with getattr changes what a run does: `PolicyExtras` says how."""
    from agentgym_core.interfaces import POLICY_EXTRAS, Policy, PolicyExtras
    from agentgym_core.rollout.text import TextPolicy

    def members(protocol) -> set[str]:
        return {n for n in vars(protocol) if not n.startswith("_")} | set(protocol.__annotations__)

    assert set(POLICY_EXTRAS) == members(PolicyExtras)
    declared = members(Policy) | members(TextPolicy) | members(PolicyExtras)
    if sources is None:
        sources = {module: path.read_text() for module, path in MODULES.items()}
    undeclared = sorted(
        read for read in _policy_getattrs(sources) if read.split(": ")[1] not in declared
    )
    assert not undeclared, "declare these in interfaces.PolicyExtras:\n" + "\n".join(undeclared)


def test_the_policy_attribute_check_can_fail():
    source = 'def f(policy):\n    return getattr(policy, "speaks_klingon", False)\n'
    with pytest.raises(AssertionError, match="x.py: speaks_klingon"):
        test_every_optional_policy_attribute_the_core_reads_is_declared({"x.py": source})
    assert _policy_getattrs({"x.py": 'getattr(self.policy, "counters", None)'}) == {
        "x.py: counters"
    }
