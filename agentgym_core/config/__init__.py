"""Run configs: YAML + OmegaConf overrides and `${}`, validated by pydantic and the plugins.

Typical use::

    resolved = load_config("configs/babyai-grpo.yaml", ["trainer.steps=200"], host.registry)
    for stage in expand_stages(resolved):
        ...  # stage.config.root.trainer.steps, stage.config.components["env"]
"""

from agentgym_core.config.errors import ConfigError, Problem
from agentgym_core.config.load import load_config
from agentgym_core.config.resolve import ResolvedConfig, validate_dict
from agentgym_core.config.schema import (
    COMPONENT_KINDS,
    AgentGymConfig,
    ComponentBlock,
    EvalConfig,
    ModelConfig,
    RolloutConfig,
    RunConfig,
    StageConfig,
    TrackingConfig,
    TrainerConfig,
)
from agentgym_core.config.stages import Stage, expand_stages

__all__ = [
    "COMPONENT_KINDS",
    "AgentGymConfig",
    "ComponentBlock",
    "ConfigError",
    "EvalConfig",
    "ModelConfig",
    "Problem",
    "ResolvedConfig",
    "RolloutConfig",
    "RunConfig",
    "Stage",
    "StageConfig",
    "TrackingConfig",
    "TrainerConfig",
    "expand_stages",
    "load_config",
    "validate_dict",
]
