"""Pipelines: one config, several stages, each the base config plus its overrides.

The trainer runs the stages in order and chains checkpoints between them;
this module only builds and validates each stage's full config.
"""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from agentgym_core.config.errors import (
    ConfigError,
    Problem,
    dotted,
    pydantic_problems,
    unknown_keys,
)
from agentgym_core.config.resolve import ResolvedConfig, validate_dict
from agentgym_core.config.schema import COMPONENT_KINDS, StageConfig
from agentgym_core.registry import RegistryError


@dataclass(frozen=True)
class Stage:
    """One stage of a run, with its complete, validated config.

    Attributes:
        name: the stage name (also the last part of its `run.output_dir`).
        type: the stage's `type` as written: a registered stage kind (`train`,
            `eval`, `evolve`, or a plugin's).
        config: the base config merged with the stage's overrides; its
            `stages` is None.
        options: the validated options of its kind (the stage's `options` block).
    """

    name: str
    type: str
    config: ResolvedConfig
    options: BaseModel | None = None
    index: int = 0
    """Position in `stages` (errors name `stages.<index>...`)."""

    @property
    def kind(self) -> str:
        """The registered kind that runs it (see `stage_kind`)."""
        return stage_kind(self.type, self.config)


def stage_kind(stage_type: str, config: ResolvedConfig) -> str:
    """A `train` stage whose algorithm is offline (SFT, DPO) runs as the `offline` kind.

    Configs name both `train`, as AgentGym's do; the algorithm's `needs.online` tells them apart.
    """
    return "offline" if stage_type == "train" and not _online(config) else stage_type


def expand_stages(resolved: ResolvedConfig) -> list[Stage]:
    """The stages of a config, in order; a config without stages is one `train` stage.

    Each stage's config is the base deep-merged with the stage's blocks (a
    component block naming another plugin replaces the base block instead, so
    one plugin's options never leak into another's), re-validated with key
    paths like `stages.1.trainer.steps`. Its `run.output_dir` is
    `<run.output_dir>/<stage name>` unless the stage sets one itself. Its type
    must be a registered stage kind, its `options` valid for that kind, and
    the kind's own `check` must pass (the implicit stage is not checked: the
    same file may serve `agentgym eval`).

    Raises:
        ConfigError: a stage's merged config is invalid.
    """
    stages = resolved.root.stages
    if not stages:
        return [Stage("train", "train", resolved)]
    base = {k: v for k, v in resolved.raw.items() if k != "stages"}
    base_output = resolved.root.run.output_dir
    out, problems = [], []
    for index, stage in enumerate(stages):
        merged = _apply(base, stage)
        if "output_dir" not in (stage.run or {}):
            merged.setdefault("run", {})["output_dir"] = f"{base_output}/{stage.name}"
        prefix = ("stages", index)
        try:
            config = validate_dict(merged, resolved.registry, prefix, resolved.source)
        except ConfigError as exc:
            problems += exc.problems
            continue
        options, found = _checked_kind(stage, config, prefix, out)
        problems += found
        out.append(Stage(stage.name, stage.type, config, options, index))
    if problems:
        raise ConfigError(problems, str(resolved.source) if resolved.source else None)
    return out


def _checked_kind(
    stage: StageConfig, config: ResolvedConfig, prefix: tuple[Any, ...], earlier: list[Stage]
) -> tuple[BaseModel | None, list[Problem]]:
    """The stage's validated options, and the problems of its type, options and kind check.

    The kind's check sees the stages before this one (a stage may read their output).
    """
    if config.registry is None:  # validated without plugins: no kinds to check against
        return None, []
    kind = stage_kind(stage.type, config)
    try:
        registration = config.registry.get("stage", kind)
    except RegistryError:
        kinds = config.registry.names("stage")
        close = difflib.get_close_matches(stage.type, kinds, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        message = f"unknown stage type {stage.type!r}{hint}; registered: {', '.join(kinds)}"
        return None, [Problem(dotted((*prefix, "type")), message)]
    options = stage.options or {}
    problems = unknown_keys(options, registration.config, (*prefix, "options"))
    try:
        validated = registration.config.model_validate(options)
    except ValidationError as exc:
        problems += pydantic_problems(exc, registration.config, (*prefix, "options"))
        validated = None
    check = getattr(registration.factory, "check", None)
    if check is not None:
        problems += check(config, prefix, earlier)
    return validated, problems


def _online(config: ResolvedConfig) -> bool:
    """Whether the stage plays rollouts (offline algorithms, SFT and DPO, need no scheduler)."""
    if "algorithm" not in config.components:
        return True
    registration, options = config.components["algorithm"]
    needs = getattr(registration.factory(options), "needs", None)
    return bool(getattr(needs, "online", True))


def _apply(base: dict[str, Any], stage: StageConfig) -> dict[str, Any]:
    return merge_blocks(base, stage.overrides())


def merge_blocks(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A config dict with `overrides` (top-level blocks) deep-merged into a copy of `base`.

    A component block naming another plugin replaces the base block instead, so
    one plugin's options never leak into another's.
    """
    merged = copy.deepcopy(base)
    for block, changes in overrides.items():
        current = merged.get(block)
        replaces = (
            block in COMPONENT_KINDS
            and isinstance(current, dict)
            and "name" in changes
            and changes["name"] != current.get("name")
        )
        if replaces or not isinstance(current, dict):
            merged[block] = copy.deepcopy(changes)
        else:
            merged[block] = deep_merge(current, changes)
    return merged


def deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` updated by `changes`: nested dicts merge, everything else (lists too) replaces."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
