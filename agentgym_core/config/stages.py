"""Pipelines: one config, several stages, each the base config plus its overrides.

The trainer runs the stages in order and chains checkpoints between them;
this module only builds and validates each stage's full config.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Literal

from agentgym_core.config.errors import ConfigError, Problem, dotted
from agentgym_core.config.resolve import ResolvedConfig, validate_dict
from agentgym_core.config.schema import COMPONENT_KINDS, StageConfig


@dataclass(frozen=True)
class Stage:
    """One stage of a run, with its complete, validated config.

    Attributes:
        name: the stage name (also the last part of its `run.output_dir`).
        type: `train` (update, then save), `eval` (evaluate only) or `evolve`
            (AgentEvol rounds, `agentgym_core.run.evolve`).
        config: the base config merged with the stage's overrides; its
            `stages` is None.
    """

    name: str
    type: Literal["train", "eval", "evolve"]
    config: ResolvedConfig


def expand_stages(resolved: ResolvedConfig) -> list[Stage]:
    """The stages of a config, in order; a config without stages is one `train` stage.

    Each stage's config is the base deep-merged with the stage's blocks (a
    component block naming another plugin replaces the base block instead, so
    one plugin's options never leak into another's), re-validated with key
    paths like `stages.1.trainer.steps`. Its `run.output_dir` is
    `<run.output_dir>/<stage name>` unless the stage sets one itself. A
    `train` stage must end up with an algorithm and a scheduler (the implicit
    stage is not checked: the same file may serve `agentgym eval`).

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
        if stage.type == "train":
            needed = ("algorithm", "scheduler") if _online(config) else ("algorithm",)
            problems += [
                Problem(dotted((*prefix, block)), f"a train stage needs {block} (none is set)")
                for block in needed
                if getattr(config.root, block) is None
            ]
        elif stage.type == "evolve":
            problems += _evolve_problems(config, prefix)
        out.append(Stage(stage.name, stage.type, config))
    if problems:
        raise ConfigError(problems, str(resolved.source) if resolved.source else None)
    return out


def _online(config: ResolvedConfig) -> bool:
    """Whether the stage plays rollouts (offline algorithms, SFT and DPO, need no scheduler)."""
    if "algorithm" not in config.components:
        return True
    registration, options = config.components["algorithm"]
    needs = getattr(registration.factory(options), "needs", None)
    return bool(getattr(needs, "online", True))


def _evolve_problems(config: ResolvedConfig, prefix: tuple[Any, ...]) -> list[Problem]:
    """An evolve stage fine-tunes with an offline algorithm that reads saved trajectories."""
    path = dotted((*prefix, "algorithm", "name"))
    if "algorithm" not in config.components:
        return [Problem(path, "an evolve stage needs an algorithm (e.g. sft); none is set")]
    registration, _ = config.components["algorithm"]
    fields = getattr(registration.config, "model_fields", {})
    if _online(config) or "trajectories" not in fields:
        return [
            Problem(
                path,
                "an evolve stage fine-tunes with an offline algorithm that reads saved "
                f"trajectories (option `trajectories`, as sft); {registration.name!r} does not",
            )
        ]
    return []


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
