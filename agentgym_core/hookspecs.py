"""Every hook a plugin may implement.

Hooks register and observe; they are never on the hot path. A plugin is a
module listed in the `agentgym` entry-point group that implements some of
these with `@agentgym_core.hookimpl`. Unknown `agentgym_*` hooks fail loudly
when plugins load (`check_pending`).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pluggy

if TYPE_CHECKING:
    from pydantic import BaseModel

    from agentgym_core.types import TrajectoryBatch

hookspec = pluggy.HookspecMarker("agentgym")


class Register(Protocol):
    """The callable a registration hook receives."""

    def __call__(self, name: str, factory: Any, *, config: type[BaseModel]) -> None:
        """Register `factory` under `name`; `config` validates the component's config block.

        `factory` may be a `"package.module:Name"` string, imported when first used, so
        that loading plugins stays light (keep `config` in a module without torch, too).
        """
        ...


# ---------------------------------------------------------------------------
# Registration: called once when the plugin manager is created
# ---------------------------------------------------------------------------


@hookspec
def agentgym_register_environments(register: Register) -> None:
    """Register environments.

    Called once per plugin when the plugin facade is created.

    Args:
        register: call `register(name, factory, config=Model)`. `factory(config)`
            receives the validated `Model` instance and returns a new object
            satisfying `agentgym_core.interfaces.Environment`, one per episode slot.
    """


@hookspec
def agentgym_register_policies(register: Register) -> None:
    """Register generation backends.

    Called once per plugin when the plugin facade is created.

    Args:
        register: call `register(name, factory, config=Model)`.
            `factory(config, model=..., tokenizer=...)` receives the validated
            config, the learner's model (or None at evaluation of a path) and
            tokenizer, and returns an `agentgym_core.interfaces.Policy`.
    """


@hookspec
def agentgym_register_algorithms(register: Register) -> None:
    """Register training algorithms.

    Called once per plugin when the plugin facade is created.

    Args:
        register: call `register(name, factory, config=Model)`. `factory(config)`
            returns an `agentgym_core.interfaces.Algorithm`.
    """


@hookspec
def agentgym_register_schedulers(register: Register) -> None:
    """Register horizon schedulers.

    Called once per plugin when the plugin facade is created.

    Args:
        register: call `register(name, factory, config=Model)`. `factory(config)`
            returns an `agentgym_core.interfaces.HorizonScheduler`.
    """


@hookspec
def agentgym_register_stage_kinds(register: Register) -> None:
    """Register kinds of pipeline stage (what `stages: [{type: ...}]` may name).

    Called once per plugin when the plugin facade is created. The core registers
    `train` (online RL), `offline` (SFT, DPO: a `train` stage whose algorithm is
    offline runs as this kind), `eval` and `evolve` the same way.

    Args:
        register: call `register(name, factory, config=Model)`. `factory(context,
            options)` receives an `agentgym_core.run.kinds.StageContext` (the stage's
            resolved config, the plugin host, the weights it starts from, earlier
            stages' folders) and the validated `Model` of the stage's `options`
            block, and returns an object whose `run(show_progress=..., quiet=...)`
            returns a `StageOutcome`. A `check(config, prefix, earlier)` static
            method on the factory, if present, returns the config `Problem`s of a
            stage of this kind (`earlier`: the stages before it) before any stage runs.
    """


@hookspec
def agentgym_add_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add `agentgym` subcommands, as pytest plugins add options (`pytest_addoption`).

    Called when the `agentgym` command line is built. Add each command with
    `subparsers.add_parser(name, help=...)` and `.set_defaults(func=...)`;
    `func(args)` returns the exit code. Import what the command needs inside
    `func`, so that `agentgym --help` stays quick. A name the core or another
    plugin already took is refused with a warning naming the plugin.

    Args:
        subparsers: the `agentgym` parser's subcommands.
    """


# ---------------------------------------------------------------------------
# Lifecycle: observe a run (trackers, user callbacks). Return values are ignored.
# Under `accelerate launch` only the main process calls them, with the whole step's
# batch and metrics (every rank holds those).
# ---------------------------------------------------------------------------


@hookspec
def agentgym_after_rollout(step: int, batch: TrajectoryBatch, metrics: Mapping[str, float]) -> None:
    """Observe the rollouts of one update, before advantages are computed.

    Args:
        step: the 0-based update step the rollouts are for.
        batch: every trajectory of the step, env errors included.
        metrics: rollout metrics (success rate, reward, turns, termination counts).
    """


@hookspec
def agentgym_after_update(step: int, metrics: Mapping[str, float]) -> None:
    """Observe the end of one update.

    Args:
        step: the 0-based update step just finished.
        metrics: every metric of the step (rollout, loss, KL, entropy, speed).
    """


@hookspec
def agentgym_after_evaluation(step: int, split: str, metrics: Mapping[str, float]) -> None:
    """Observe an evaluation.

    Args:
        step: the update step the evaluated weights come from.
        split: the task split evaluated (`"test"` usually).
        metrics: success rate, mean reward, Avg@k and Pass@k, per group too.
    """


@hookspec
def agentgym_on_checkpoint(step: int, path: Path) -> None:
    """Observe a checkpoint written to disk.

    Args:
        step: the number of updates the checkpoint contains.
        path: the checkpoint folder (Hugging Face format plus `trainer_state.pt`).
    """
