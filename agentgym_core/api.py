"""The plugin API: everything a plugin imports from agentgym-core, in one place.

This module is the stable surface. Names imported from here keep their
meaning within a minor version (`agentgym-core>=0.1,<0.2`); every other
module of `agentgym_core` is internal and may change in any release. The
shipped plugins import only from here (`tests/test_meta.py` checks it).

What is here:

- registration: `hookimpl`, `Register` (the callable the
  `agentgym_register_*` hooks receive; see `agentgym_core.hookspecs`), and
  `lazy_exports`, so that a plugin package lends its torch-bound classes
  without importing them when the plugin loads;
- the protocols a plugin implements: `Environment`, `Policy`, `Algorithm`,
  `OfflineAlgorithm`, `HorizonScheduler`, and what they exchange
  (`SamplingParams`, `AlgorithmNeeds`, `CriticSpec`, `LossInputs`,
  `SequenceInputs`, `OfflineDataset`, `ExpertEnvironment`, `RelabelableEnvironment`,
  `TextPolicy`);
- plain data: `StepResult`, `Generation`, `Turn`, `Trajectory`,
  `TrajectoryBatch`, `Termination`, `TaskId`;
- RL maths for algorithm plugins: the token-level losses (`clipped_policy_loss`,
  `clipped_loss_with_kl_and_entropy` and its options `ClippedLossOptions`,
  `clipped_value_loss`, `entropy_bonus`, `kl_k3`, `kl_penalty`, `masked_mean`)
  and reward placement (`token_rewards`, `agent_positions`, `agent_values`,
  `spread`, `whiten`, `turn_spans`), the group baseline (`group_normalize`,
  `GroupStd`);
- task ids over (kind, seed) pairs for environment plugins (`seeded_task_ids`,
  `seeded_task`, `SeededTask`, `TEST_SEED_OFFSET`), and the task lists of envs
  that play on a server (`TaskList`, `TaskRange`, `listed_tasks`);
- a sandbox for env plugins that run model-written code (`PythonSandbox`,
  `SandboxLimits`, `SandboxResult`, `SandboxUnavailable`; docs/sandbox.md);
- helpers for policy plugins: `ActionConstraint` (constrained decoding),
  `full_weights` (a model's weights for a weight sync, a LoRA adapter merged in),
  `fingerprint` (sums of a model's weights, equal on every rank that holds them),
  `ChatFormat`, `ChatMessage` (a chat API's message, also lent as `Message`),
  `ContextWindowExceeded`;
- for plugins that talk HTTP to a server: `IDLE_REUSE_S` (how long an idle kept-alive
  connection may be reused);
- data: `read_items`, `read_pairs`, `AgentTrajItem`, `AgentTrajPair` (AgentTraj JSON);
- errors: `ConfigError`, `Problem` (a user-facing config error naming its key);
- stage kinds (`agentgym_register_stage_kinds`): `StageContext`, `StageOutcome`,
  and `run_stage` to run another kind inside one's own;
- the test kit: `check_environment`, `EnvironmentCheckError` (the pytest
  fixtures `agentgym_plugin`, `agentgym_host` and `tiny_model_dir` load by
  themselves once agentgym-core is installed).

Importing this module is cheap: the protocols and data types load at once,
the rest (torch among them) on first use, so an environment plugin that
imports `hookimpl` and `StepResult` from here never loads torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentgym_core import PROJECT, __version__, hookimpl
from agentgym_core.hookspecs import Register
from agentgym_core.interfaces import (
    Algorithm,
    AlgorithmNeeds,
    CriticSpec,
    Environment,
    HorizonScheduler,
    LossInputs,
    OfflineAlgorithm,
    OfflineDataset,
    Policy,
    SamplingParams,
    SequenceInputs,
)
from agentgym_core.lazy import lazy_exports
from agentgym_core.types import (
    Generation,
    StepResult,
    TaskId,
    Termination,
    Trajectory,
    TrajectoryBatch,
    Turn,
)

if TYPE_CHECKING:
    from agentgym_core.config.errors import ConfigError, Problem
    from agentgym_core.data.agenttraj import AgentTrajItem, AgentTrajPair, read_items, read_pairs
    from agentgym_core.data.expert import ExpertEnvironment
    from agentgym_core.data.relabel import RelabelableEnvironment
    from agentgym_core.distributed import fingerprint
    from agentgym_core.learner.lora import full_weights
    from agentgym_core.learner.losses import (
        clipped_loss_with_kl_and_entropy,
        clipped_policy_loss,
        clipped_value_loss,
        entropy_bonus,
        kl_k3,
        kl_penalty,
        masked_mean,
    )
    from agentgym_core.learner.options import ClippedLossOptions
    from agentgym_core.learner.rewards import (
        GroupStd,
        agent_positions,
        agent_values,
        group_normalize,
        older_scale_by_std,
        spread,
        token_rewards,
        turn_spans,
        whiten,
    )
    from agentgym_core.policies.constraints import ActionConstraint
    from agentgym_core.rollout.chat import ChatFormat
    from agentgym_core.rollout.engine import PolicyError
    from agentgym_core.rollout.text import ChatMessage, ContextWindowExceeded, Message, TextPolicy
    from agentgym_core.run.kinds import StageContext, StageOutcome, run_stage
    from agentgym_core.sandbox import (
        PythonSandbox,
        SandboxLimits,
        SandboxResult,
        SandboxUnavailable,
    )
    from agentgym_core.serve.runner import IDLE_REUSE_S
    from agentgym_core.task_lists import TaskList, TaskRange, listed_tasks
    from agentgym_core.tasks import TEST_SEED_OFFSET, SeededTask, seeded_task, seeded_task_ids
    from agentgym_core.testing import EnvironmentCheckError, check_environment

_LAZY = {
    "agentgym_core.config.errors": ("ConfigError", "Problem"),
    "agentgym_core.data.agenttraj": ("AgentTrajItem", "AgentTrajPair", "read_items", "read_pairs"),
    "agentgym_core.data.expert": ("ExpertEnvironment",),
    "agentgym_core.data.relabel": ("RelabelableEnvironment",),
    "agentgym_core.distributed": ("fingerprint",),
    "agentgym_core.learner.losses": (
        "clipped_loss_with_kl_and_entropy",
        "clipped_policy_loss",
        "clipped_value_loss",
        "entropy_bonus",
        "kl_k3",
        "kl_penalty",
        "masked_mean",
    ),
    "agentgym_core.learner.lora": ("full_weights",),
    "agentgym_core.learner.options": ("ClippedLossOptions",),
    "agentgym_core.learner.rewards": (
        "GroupStd",
        "agent_positions",
        "agent_values",
        "group_normalize",
        "older_scale_by_std",
        "spread",
        "token_rewards",
        "turn_spans",
        "whiten",
    ),
    "agentgym_core.policies.constraints": ("ActionConstraint",),
    "agentgym_core.rollout.chat": ("ChatFormat",),
    "agentgym_core.rollout.engine": ("PolicyError",),
    "agentgym_core.rollout.text": ("ChatMessage", "ContextWindowExceeded", "Message", "TextPolicy"),
    "agentgym_core.sandbox": (
        "PythonSandbox",
        "SandboxLimits",
        "SandboxResult",
        "SandboxUnavailable",
    ),
    "agentgym_core.serve.runner": ("IDLE_REUSE_S",),
    "agentgym_core.task_lists": ("TaskList", "TaskRange", "listed_tasks"),
    "agentgym_core.tasks": ("TEST_SEED_OFFSET", "SeededTask", "seeded_task", "seeded_task_ids"),
    "agentgym_core.run.kinds": ("StageContext", "StageOutcome", "run_stage"),
    "agentgym_core.testing": ("EnvironmentCheckError", "check_environment"),
}
"""Module -> names it lends this API, imported on first access (PEP 562)."""
_HOME = {name: module for module, names in _LAZY.items() for name in names}

__all__ = [
    "IDLE_REUSE_S",
    "PROJECT",
    "TEST_SEED_OFFSET",
    "ActionConstraint",
    "AgentTrajItem",
    "AgentTrajPair",
    "Algorithm",
    "AlgorithmNeeds",
    "ChatFormat",
    "ChatMessage",
    "ClippedLossOptions",
    "ConfigError",
    "ContextWindowExceeded",
    "CriticSpec",
    "Environment",
    "EnvironmentCheckError",
    "ExpertEnvironment",
    "Generation",
    "GroupStd",
    "HorizonScheduler",
    "LossInputs",
    "Message",
    "OfflineAlgorithm",
    "OfflineDataset",
    "Policy",
    "PolicyError",
    "Problem",
    "PythonSandbox",
    "Register",
    "RelabelableEnvironment",
    "SamplingParams",
    "SandboxLimits",
    "SandboxResult",
    "SandboxUnavailable",
    "SeededTask",
    "SequenceInputs",
    "StageContext",
    "StageOutcome",
    "StepResult",
    "TaskId",
    "TaskList",
    "TaskRange",
    "Termination",
    "TextPolicy",
    "Trajectory",
    "TrajectoryBatch",
    "Turn",
    "__version__",
    "agent_positions",
    "agent_values",
    "check_environment",
    "clipped_loss_with_kl_and_entropy",
    "clipped_policy_loss",
    "clipped_value_loss",
    "entropy_bonus",
    "fingerprint",
    "full_weights",
    "group_normalize",
    "hookimpl",
    "kl_k3",
    "kl_penalty",
    "lazy_exports",
    "listed_tasks",
    "masked_mean",
    "older_scale_by_std",
    "read_items",
    "read_pairs",
    "run_stage",
    "seeded_task",
    "seeded_task_ids",
    "spread",
    "token_rewards",
    "turn_spans",
    "whiten",
]


__getattr__ = lazy_exports(__name__, _HOME)


def __dir__() -> list[str]:
    return sorted(__all__)
