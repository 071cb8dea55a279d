"""Load a run config: YAML file, schema defaults, `key=value` overrides, `${}`, validation.

Order matters: defaults come first so `${trainer.group_size}` works even when
the file does not write it; overrides come before interpolation so
`run.name=x` also changes `runs/${run.name}`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from agentgym_core.config.errors import ConfigError, Problem
from agentgym_core.config.resolve import ResolvedConfig, validate_dict
from agentgym_core.config.schema import schema_defaults
from agentgym_core.config.stages import expand_stages
from agentgym_core.registry import Registry

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*$")


def load_config(
    path: str | Path | None,
    overrides: Sequence[str] = (),
    registry: Registry | None = None,
) -> ResolvedConfig:
    """Load, override, interpolate and validate a config; stages are checked too.

    Args:
        path: the YAML file; None builds the config from defaults and overrides.
        overrides: `key.path=value` strings (values parsed as YAML), applied
            in order; list items are addressed by index (`stages.1.trainer.steps=5`).
        registry: where component names are looked up and their options
            validated; None checks only the root schema.

    Raises:
        ConfigError: every problem found, each with its full key path.
    """
    source = str(path) if path is not None else None
    text, data = _read(Path(path)) if path is not None else ("", {})
    _fill_defaults(data)
    cfg = OmegaConf.create(data)
    origins: dict[str, str] = {}
    problems = _apply_overrides(cfg, overrides, origins)
    resolved = None
    try:
        raw = _resolve(cfg)
        resolved = validate_dict(raw, registry, source=Path(path) if path is not None else None)
        expand_stages(resolved)
    except ConfigError as exc:
        problems += exc.problems
    if problems or resolved is None:
        locate = _Locator(text, source, origins)
        raise ConfigError([locate(p) for p in problems], source)
    return resolved


def _read(path: Path) -> tuple[str, dict[str, Any]]:
    """The file's text and its unresolved content as plain containers."""
    if not path.is_file():
        raise ConfigError([Problem("", "config file not found")], str(path))
    text = path.read_text(encoding="utf-8")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        cfg = OmegaConf.load(path) if node is not None else OmegaConf.create({})
    except yaml.YAMLError as exc:
        raise ConfigError([_yaml_problem(exc, str(path), text)], str(path)) from None
    except OmegaConfBaseException as exc:
        raise ConfigError([_omegaconf_problem(exc)], str(path)) from None
    if node is not None and not isinstance(node, yaml.MappingNode):
        found = "a list" if isinstance(node, yaml.SequenceNode) else f"{node.value!r}"
        problem = Problem("", f"top level must be a mapping of blocks, got {found}")
        raise ConfigError([problem], str(path))
    return text, OmegaConf.to_container(cfg, resolve=False)  # type: ignore[return-value]


def _fill_defaults(data: dict[str, Any]) -> None:
    """Add schema defaults for keys the file leaves out (one level deep: blocks are flat)."""
    for block, default in schema_defaults().items():
        current = data.get(block)
        if block not in data:
            data[block] = default
        elif isinstance(current, dict) and isinstance(default, dict):
            for key, value in default.items():
                current.setdefault(key, value)


def _apply_overrides(
    cfg: DictConfig, overrides: Sequence[str], origins: dict[str, str]
) -> list[Problem]:
    """Apply `key=value` strings in order, recording in `origins` which override set a key.

    Returns the overrides that could not be applied, so they are reported with the rest.
    """
    problems = []
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip().removeprefix("+")
        where = f"override {item!r}"
        if not sep or not _KEY.match(key):
            message = "bad override syntax: expected key.path=value, e.g. trainer.steps=200"
            problems.append(Problem(key, message, where))
            continue
        try:
            parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={value}"]))["v"]
            OmegaConf.update(cfg, key, parsed, merge=True)
        except (yaml.YAMLError, OmegaConfBaseException, TypeError, ValueError) as exc:
            first = getattr(exc, "problem", None) or str(exc).strip().splitlines()[0]
            problems.append(Problem(key, f"cannot apply override: {first}", where))
            continue
        origins[key] = item
    return problems


def _resolve(cfg: DictConfig) -> dict[str, Any]:
    """Interpolate every `${}`; a bad one is reported with the key that holds it."""
    problems = _interpolation_problems(cfg, (), OmegaConf.to_container(cfg, resolve=False))
    if problems:
        raise ConfigError(problems)
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def _interpolation_problems(node: DictConfig | ListConfig, path: tuple, raw: Any) -> list[Problem]:
    problems = []
    keys = range(len(node)) if isinstance(node, ListConfig) else list(node.keys())
    for key in keys:
        if OmegaConf.is_interpolation(node, key) or OmegaConf.is_missing(node, key):
            try:
                node[key]
            except OmegaConfBaseException as exc:
                problems.append(_omegaconf_problem(exc, (*path, key), raw[key]))
            continue
        child = node[key]
        if isinstance(child, (DictConfig, ListConfig)):
            problems += _interpolation_problems(child, (*path, key), raw[key])
    return problems


def _omegaconf_problem(exc: OmegaConfBaseException, path: tuple = (), raw: Any = None) -> Problem:
    message = str(getattr(exc, "msg", None) or exc).strip().splitlines()[0]
    if path:
        key = ".".join(map(str, path))
    else:
        key = re.sub(r"\[(\d+)\]", r".\1", str(getattr(exc, "full_key", "") or ""))
    if raw == "???":
        return Problem(key, "missing mandatory value (???)")
    shown = f" {raw!r}" if isinstance(raw, str) else ""
    return Problem(key, f"cannot resolve interpolation{shown}: {message}")


def _yaml_problem(exc: yaml.YAMLError, source: str, text: str) -> Problem:
    mark = getattr(exc, "problem_mark", None)
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    detail = f"{context}: {problem}" if context else problem
    line = text.splitlines()[mark.line] if mark and mark.line < len(text.splitlines()) else ""
    if "${" in line:
        detail += " (inside {...} or [...], quote a value that holds ${...})"
    return Problem("", f"YAML syntax error: {detail}", where)


class _Locator:
    """Adds where a problem's key was written: the override, else the file line."""

    def __init__(self, text: str, source: str | None, origins: dict[str, str]) -> None:
        self.source = source
        self.origins = origins
        self.lines = _key_lines(text) if text else {}

    def __call__(self, problem: Problem) -> Problem:
        if problem.where:
            return problem
        path = problem.path
        for key, item in self.origins.items():
            if path == key or path.startswith(key + "."):
                return replace(problem, where=f"override {item!r}")
        line = self.lines.get(path) or self.lines.get(re.sub(r"^stages\.\d+\.", "", path))
        if line and self.source:
            return replace(problem, where=f"{self.source}:{line}")
        return problem


def _key_lines(text: str) -> dict[str, int]:
    """Dotted key path -> 1-based line where it is written in the YAML text."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    lines: dict[str, int] = {}

    def walk(node: yaml.Node, path: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                child = f"{path}.{key_node.value}" if path else str(key_node.value)
                lines[child] = key_node.start_mark.line + 1
                walk(value_node, child)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                child = f"{path}.{index}" if path else str(index)
                lines[child] = item.start_mark.line + 1
                walk(item, child)

    if root is not None:
        walk(root, "")
    return lines
