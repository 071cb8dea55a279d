"""Validation of a plain config dict against the root schema and the plugins' models.

Kept apart from file loading so that stage expansion can re-validate merged
dicts with the same rules and the same error paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from agentgym_core.config.errors import (
    ConfigError,
    Problem,
    dotted,
    pydantic_problems,
    unknown_keys,
)
from agentgym_core.config.schema import COMPONENT_KINDS, AgentGymConfig
from agentgym_core.registry import Registration, Registry, RegistryError


@dataclass
class ResolvedConfig:
    """A validated config: the root model plus each component's registration and options.

    Attributes:
        root: the validated root model (component options still raw in it).
        components: block name (`env`, `policy`, ...) -> (registration, validated
            options); empty when validated without a registry.
        source: the file it was loaded from, if any.
        raw: the plain, interpolated dict it was validated from (stages merge onto it).
        registry: the registry components were looked up in, if any.
    """

    root: AgentGymConfig
    components: dict[str, tuple[Registration, BaseModel]] = field(default_factory=dict)
    source: Path | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)
    registry: Registry | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """Plain, fully resolved dict with every default filled, component options included."""
        out = self.root.model_dump(mode="json")
        for block, (registration, options) in self.components.items():
            out[block] = {"name": registration.name, **options.model_dump(mode="json")}
        if out.get("stages") is not None:
            out["stages"] = [
                {k: v for k, v in stage.items() if v is not None} for stage in out["stages"]
            ]
        return out

    def save(self, path: str | Path) -> Path:
        """Write `to_dict()` as YAML that `load_config` reads back to the same config."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = yaml.safe_dump(_escape(self.to_dict()), sort_keys=False, allow_unicode=True)
        header = "# Resolved agentgym config: every default filled, interpolations applied.\n"
        path.write_text(header + text, encoding="utf-8")
        return path


def validate_dict(
    raw: dict[str, Any],
    registry: Registry | None = None,
    prefix: Sequence[Any] = (),
    source: Path | None = None,
) -> ResolvedConfig:
    """Validate a plain dict; raise one `ConfigError` naming every problem.

    `prefix` is prepended to every key path (`stages.1` for a stage's config).
    """
    problems: list[Problem] = []
    root: AgentGymConfig | None = None
    try:
        root = AgentGymConfig.model_validate(raw)
        problems += _cross_checks(root, prefix)
    except ValidationError as exc:
        problems += pydantic_problems(exc, AgentGymConfig, prefix)
    components: dict[str, tuple[Registration, BaseModel]] = {}
    if registry is not None:
        for block, kind, spec in _component_specs(raw, root):
            found = _validate_component(registry, block, kind, spec, prefix)
            if isinstance(found, list):
                problems += found
            else:
                components[block] = found
    if problems:
        raise ConfigError(problems, str(source) if source else None)
    assert root is not None
    return ResolvedConfig(root, components, source, raw, registry)


def _cross_checks(root: AgentGymConfig, prefix: Sequence[Any]) -> list[Problem]:
    """Rules spanning blocks, reported at the key a user would add."""
    if root.scheduler is None and root.eval.max_turns is None:
        message = (
            "no turn limit: set a scheduler (e.g. {name: fixed, max_turns: 20}) or eval.max_turns"
        )
        return [Problem(dotted((*prefix, "scheduler")), message)]
    return []


def _component_specs(
    raw: dict[str, Any], root: AgentGymConfig | None
) -> list[tuple[str, str, dict[str, Any]]]:
    """Component blocks to look up: from the model when valid, else whatever is usable in raw."""
    specs = []
    for block, kind in COMPONENT_KINDS.items():
        if root is not None:
            value = getattr(root, block)
            spec = value.model_dump() if value is not None else None
        else:
            spec = raw.get(block)
        if isinstance(spec, dict) and isinstance(spec.get("name"), str):
            specs.append((block, kind, spec))
    return specs


def _validate_component(
    registry: Registry, block: str, kind: str, spec: dict[str, Any], prefix: Sequence[Any]
) -> tuple[Registration, BaseModel] | list[Problem]:
    try:
        registration = registry.get(kind, spec["name"])
    except RegistryError as exc:
        return [Problem(dotted((*prefix, block, "name")), str(exc))]
    options = {k: v for k, v in spec.items() if k != "name"}
    problems = unknown_keys(options, registration.config, (*prefix, block))
    try:
        validated = registration.config.model_validate(options)
    except ValidationError as exc:
        return problems + pydantic_problems(exc, registration.config, (*prefix, block))
    return problems or (registration, validated)


def _escape(value: Any) -> Any:
    """Escape `${` so saved strings stay literal when OmegaConf reads them back."""
    if isinstance(value, str):
        return value.replace("${", "\\${")
    if isinstance(value, dict):
        return {k: _escape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_escape(v) for v in value]
    return value
