"""Stage kinds: what a pipeline stage of each `type` runs, registered like components.

The core registers its kinds through the same hook a plugin would use
(`agentgym_register_stage_kinds`): `train` (online RL), `offline` (SFT, DPO:
a `train` stage whose algorithm is offline), `eval` and `evolve`. A kind is a
factory `factory(context, options)` of a runner whose `run(...)` returns a
`StageOutcome`; the pipeline chains outcomes, each stage starting from the
previous one's checkpoint. Kinds import their modules on first use, so a
plugin host loads without torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from agentgym_core import hookimpl
from agentgym_core.config.errors import ConfigError, Problem


@dataclass(frozen=True)
class StageContext:
    """What a stage runner gets besides its options."""

    config: Any
    """The stage's `ResolvedConfig` (the base config with the stage's overrides)."""
    host: Any
    """The `PluginHost`: lifecycle hooks, the registry."""
    start_model: Path
    """The weights the stage starts from: the previous stage's checkpoint, or `model.path`."""
    name: str = "train"
    """The stage's name in the pipeline."""
    earlier: Mapping[str, Path] = field(default_factory=dict)
    """Output folders of the stages that ran before, by name."""
    prefix: tuple[Any, ...] = ()
    """Key-path prefix of this stage in errors (`("stages", 2)`)."""
    tracker: Any | None = None
    """The stage's MLflow tracker, on the main process of a pipeline run (else None)."""
    recorder: Any | None = None
    """The stage's rollout recorder when `tracking.save_rollouts` (else None)."""


@dataclass
class StageOutcome:
    """What a stage leaves behind."""

    checkpoint: Path
    """The weights the next stage starts from (an eval stage passes its own start on)."""
    history: list[dict[str, float]] = field(default_factory=list)
    """Per-update metrics (a resumed stage's include those before the resume)."""
    resumed_from: int = 0
    """The update a resumed stage continued from (0: a fresh start)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The stage's summary: an evaluation's metrics, else the last update's."""


def last_metrics(history: list[dict[str, float]]) -> dict[str, float]:
    """A training stage's summary: its last update's metrics (none: empty)."""
    return dict(history[-1]) if history else {}


def raise_problems(problems: list[Problem], config: Any) -> None:
    """Raise the problems of a stage's config as one `ConfigError` naming its file."""
    if problems:
        raise ConfigError(problems, str(config.source) if config.source else None)


class NoOptions(BaseModel):
    """The built-in kinds take no `options`: their settings are the config's own blocks."""

    model_config = ConfigDict(extra="forbid")


class _Lazy:
    """A kind's factory that imports `module.name` when first called (or checked)."""

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name

    def _target(self) -> Any:
        return getattr(importlib.import_module(self.module), self.name)

    def __call__(self, context: StageContext, options: BaseModel | None) -> Any:
        return self._target()(context, options)

    def check(self, config: Any, prefix: Sequence[Any], earlier: Sequence[Any]) -> list[Problem]:
        """The target's own `check`, if it has one."""
        check = getattr(self._target(), "check", None)
        return check(config, tuple(prefix), earlier) if check is not None else []


BUILTIN_KINDS = {
    "train": _Lazy("agentgym_core.run.train", "TrainStage"),
    "offline": _Lazy("agentgym_core.run.offline", "OfflineStage"),
    "eval": _Lazy("agentgym_core.run.eval_stage", "EvalStage"),
    "evolve": _Lazy("agentgym_core.run.evolve", "EvolveStage"),
}


@hookimpl
def agentgym_register_stage_kinds(register):
    """Register the core's stage kinds."""
    for name, factory in BUILTIN_KINDS.items():
        register(name, factory, config=NoOptions)


def run_stage(
    resolved: Any,
    host: Any,
    *,
    kind: str | None = None,
    name: str = "train",
    options: BaseModel | None = None,
    start_model: str | Path | None = None,
    earlier: Mapping[str, Path] | None = None,
    prefix: tuple[Any, ...] = (),
    tracker: Any | None = None,
    recorder: Any | None = None,
    show_progress: bool = True,
    quiet: bool = False,
) -> StageOutcome:
    """Run one stage of kind `kind` (None: the config's own, `train` or `offline`).

    Starts from `start_model` (None: `model.path`).
    """
    from agentgym_core.config.stages import stage_kind
    from agentgym_core.numerics import subnormals_flushed

    kind = kind or stage_kind("train", resolved)
    registration = resolved.registry.get("stage", kind)
    context = StageContext(
        config=resolved,
        host=host,
        start_model=Path(start_model or resolved.root.model.path),
        name=name,
        earlier=dict(earlier or {}),
        prefix=prefix,
        tracker=tracker,
        recorder=recorder,
    )
    with subnormals_flushed():  # a trained model's subnormals would slow the CPU (numerics.py)
        runner = registration.factory(context, options)
        return runner.run(show_progress=show_progress, quiet=quiet)
