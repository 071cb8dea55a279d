"""Config loading: overrides, interpolation, key-path errors, plugin options, stages."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pytest
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from agentgym_core.config import (
    AgentGymConfig,
    ComponentBlock,
    ConfigError,
    expand_stages,
    load_config,
)
from agentgym_core.config import schema as schema_module
from agentgym_core.registry import Registration, Registry
from agentgym_core.run.kinds import BUILTIN_KINDS, NoOptions

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

BASE = """\
run: {name: demo, seed: 3}
model: {path: models/tiny}
env: {name: grid, levels: [GoTo, Pickup]}
algorithm: {name: grpo, kl_coef: 0.01}
scheduler: {name: fixed, max_turns: 8}
trainer: {steps: 10, group_size: 4}
"""

# -- a fake registry: small option models, one per kind --------------------------------


def _level(value: str) -> str:
    if value not in ("GoTo", "Pickup", "Open"):
        raise ValueError(f"unknown level {value!r}")
    return value


class GridOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    levels: list[Annotated[str, AfterValidator(_level)]] = Field(default_factory=lambda: ["GoTo"])
    max_steps: int = Field(64, gt=0)


class GRPOOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kl_coef: float = Field(0.0, ge=0)
    clip_eps: float = Field(0.2, gt=0)


class SFTOptions(BaseModel):
    """Left at pydantic's default `extra="ignore"`: unknown keys must still be errors."""

    dataset: str = "expert"


class FixedOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_turns: int = Field(gt=0)


class HFOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_batch_size: int = Field(64, gt=0)


@pytest.fixture
def registry() -> Registry:
    reg = Registry()
    for kind, name, options in [
        ("environment", "grid", GridOptions),
        ("algorithm", "grpo", GRPOOptions),
        ("algorithm", "sft", SFTOptions),
        ("scheduler", "fixed", FixedOptions),
        ("policy", "hf", HFOptions),
    ]:
        reg.add(Registration(kind, name, dict, options, "tests", "0"))
    for name, factory in BUILTIN_KINDS.items():  # the core's stage kinds, as a host has them
        reg.add(Registration("stage", name, factory, NoOptions, "tests", "0"))
    return reg


@pytest.fixture
def write(tmp_path):
    def _write(text: str, name: str = "run.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return _write


def errors_of(path, overrides=(), registry=None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides, registry)
    return str(info.value)


# -- defaults and the schema ---------------------------------------------------------


def test_minimal_config_fills_defaults(write, registry):
    path = write("model: {path: m}\nenv: {name: grid}\neval: {max_turns: 5}\n")
    resolved = load_config(path, registry=registry)
    root = resolved.root
    assert root.run.output_dir == "runs/agentgym"
    assert root.policy.name == "hf"
    assert root.algorithm is None and root.scheduler is None and root.stages is None
    assert root.trainer.steps == 100 and root.rollout.concurrency == 64
    assert resolved.components["env"][1] == GridOptions()
    assert set(resolved.components) == {"env", "policy"}


def test_a_turn_limit_is_required(write):
    message = errors_of(write("model: {path: m}\nenv: {name: grid}\n"))
    assert "scheduler: no turn limit" in message


def test_output_dir_defaults_from_run_name_in_python_too():
    config = AgentGymConfig(model={"path": "m"}, env=ComponentBlock(name="grid"), run={"name": "x"})
    assert config.run.output_dir == "runs/x"


def test_every_field_is_described():
    models = [AgentGymConfig, ComponentBlock, schema_module.StageConfig]
    models += [f.annotation for f in AgentGymConfig.model_fields.values()]
    for model in models:
        if isinstance(model, type) and issubclass(model, BaseModel):
            for name, field in model.model_fields.items():
                assert field.description, f"{model.__name__}.{name} has no description"


def test_every_field_is_in_the_reference():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "config.md").read_text()
    for block, field in AgentGymConfig.model_fields.items():
        assert f"`{block}`" in doc, block
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel) and model is not ComponentBlock:
            for name in model.model_fields:
                assert f"| `{name}` |" in doc, f"{block}.{name} missing from docs/config.md"


def test_fixed_blocks_forbid_unknown_keys():
    for field in AgentGymConfig.model_fields.values():
        model = field.annotation
        if isinstance(model, type) and issubclass(model, BaseModel) and model is not ComponentBlock:
            assert model.model_config.get("extra") == "forbid", model.__name__


# -- each kind of mistake names its key path ---------------------------------------------


def test_bound_violation_names_path_value_and_line(write):
    path = write(BASE.replace("steps: 10", "steps: -3"))
    message = errors_of(path)
    assert "trainer.steps: Input should be greater than 0 (got -3)" in message
    assert f"{path}:6:" in message


def test_unknown_key_suggests_the_closest(write):
    message = errors_of(write(BASE + "trainr: {}\neval: {splitt: test}\n"))
    assert "trainr: unknown key (did you mean 'trainer'?)" in message
    assert "eval.splitt: unknown key (did you mean 'split'?)" in message


def test_unknown_key_without_close_match_lists_valid_keys(write):
    message = errors_of(write(BASE + "tracking: {zzz: 1}\n"))
    assert "tracking.zzz: unknown key; valid keys: uri, experiment" in message


def test_missing_required_blocks(write):
    message = errors_of(write("run: {name: x}\n"))
    assert "model: missing required key" in message
    assert "env: missing required key" in message


def test_cross_field_check(write):
    message = errors_of(write(BASE + "rollout: {max_new_tokens: 2048}\n"))
    assert "rollout: max_new_tokens (2048) must be below max_context_tokens" in message


def test_all_problems_reported_at_once_with_the_file(write):
    path = write(BASE.replace("steps: 10", "steps: 0, stepz: 1") + "eval: {k: 0}\n")
    message = errors_of(path)
    assert f"invalid config in {path} (3 problems)" in message
    assert "trainer.stepz: unknown key (did you mean 'steps'?)" in message
    assert "eval.k: Input should be greater than 0 (got 0)" in message


def test_yaml_syntax_error_gives_file_and_line(write):
    path = write("run:\n  name: x\n model: [\n")
    message = errors_of(path)
    assert "YAML syntax error" in message and f"{path}:3:" in message


def test_unquoted_interpolation_in_flow_mapping_gets_a_hint(write):
    message = errors_of(write("run: {name: a, output_dir: runs/${run.name}}\n"))
    assert ":1:" in message and "quote a value that holds ${...}" in message


def test_duplicate_yaml_key_is_an_error(write):
    assert "duplicate key" in errors_of(write("run: {}\nrun: {}\n"))


def test_top_level_must_be_a_mapping(write):
    assert "top level must be a mapping of blocks, got a list" in errors_of(write("- a\n- b\n"))


def test_missing_file(tmp_path):
    message = errors_of(tmp_path / "nope.yaml")
    assert "nope.yaml" in message and "config file not found" in message


def test_bad_override_syntax(write):
    message = errors_of(write(BASE), ["trainer.steps", "=3", "a..b=1", "x=[1,"])
    assert "override 'trainer.steps': trainer.steps: bad override syntax" in message
    assert "override '=3'" in message and "override 'a..b=1'" in message
    assert "override 'x=[1,'" in message


def test_interpolation_to_missing_key(write):
    message = errors_of(write(BASE + "tracking: {experiment: '${run.nme}'}\n"))
    assert "tracking.experiment: cannot resolve interpolation '${run.nme}'" in message
    assert "run.nme" in message


def test_missing_mandatory_value(write):
    path = write("model:\n  path: ???\nenv: {name: grid}\n")
    assert f"{path}:2: model.path: missing mandatory value" in errors_of(path)


# -- components against the registry ------------------------------------------------------


def test_component_options_validated_and_filled(write, registry):
    resolved = load_config(write(BASE), registry=registry)
    registration, options = resolved.components["algorithm"]
    assert registration.name == "grpo" and options == GRPOOptions(kl_coef=0.01)
    assert resolved.to_dict()["algorithm"] == {"name": "grpo", "kl_coef": 0.01, "clip_eps": 0.2}
    assert resolved.to_dict()["policy"] == {"name": "hf", "max_batch_size": 64}


def test_component_option_errors_name_the_block(write, registry):
    path = write(BASE.replace("Pickup", "Pickup, Foo").replace("max_turns", "max_turn"))
    message = errors_of(path, registry=registry)
    assert "env.levels.2: unknown level 'Foo'" in message
    assert "scheduler.max_turn: unknown key (did you mean 'max_turns'?)" in message
    assert "scheduler.max_turns: missing required key" in message


def test_unknown_component_lists_installed(write, registry):
    message = errors_of(write(BASE.replace("grpo", "grpoo")), registry=registry)
    assert "algorithm.name: unknown algorithm 'grpoo'; installed: grpo, sft" in message


def test_plugin_model_that_ignores_extras_still_rejects_unknown_keys(write, registry):
    path = write(BASE.replace("{name: grpo, kl_coef: 0.01}", "{name: sft, datset: x}"))
    assert "algorithm.datset: unknown key (did you mean 'dataset'?)" in errors_of(
        path, registry=registry
    )


def test_component_errors_reported_with_root_errors(write, registry):
    path = write(BASE.replace("steps: 10", "steps: -1").replace("grpo", "nope"))
    message = errors_of(path, registry=registry)
    assert "trainer.steps" in message and "algorithm.name: unknown algorithm 'nope'" in message


# -- overrides and interpolation -------------------------------------------------------------


def test_overrides_of_existing_and_unwritten_keys(write, registry):
    overrides = ["trainer.steps=200", "algorithm.kl_coef=0.0", "eval.k=4", "eval.greedy=true"]
    resolved = load_config(write(BASE), overrides, registry)
    root = resolved.root
    assert root.trainer.steps == 200 and root.eval.k == 4 and root.eval.greedy is True
    assert resolved.components["algorithm"][1].kl_coef == 0.0


def test_override_adds_a_whole_block_and_parses_values(write, registry):
    path = write("model: {path: m}\nenv: {name: grid}\n")
    overrides = [
        "scheduler.name=fixed",
        "scheduler.max_turns=3",
        "algorithm.name=grpo",
        "env.levels=[Open,GoTo]",
        "trainer.max_grad_norm=null",
    ]
    resolved = load_config(path, overrides, registry)
    assert resolved.components["env"][1].levels == ["Open", "GoTo"]
    assert resolved.root.algorithm.name == "grpo" and resolved.root.trainer.max_grad_norm is None


def test_override_errors_name_the_override(write):
    message = errors_of(write(BASE), ["trainer.steps=-5", "trainer.stepz=1"])
    assert "override 'trainer.steps=-5': trainer.steps: Input should be greater than 0" in message
    assert "override 'trainer.stepz=1': trainer.stepz: unknown key" in message


def test_list_item_override(write, registry):
    resolved = load_config(write(BASE), ["env.levels.1=Open"], registry)
    assert resolved.components["env"][1].levels == ["GoTo", "Open"]


def test_load_without_file(registry):
    resolved = load_config(None, ["model.path=m", "env.name=grid", "eval.max_turns=4"], registry)
    assert resolved.source is None and resolved.root.model.path == "m"


def test_interpolation_sees_overrides_and_defaults(write):
    text = BASE + "tracking: {experiment: 'g${trainer.group_size}-${rollout.concurrency}'}\n"
    resolved = load_config(write(text), ["run.name=other"])
    assert resolved.root.run.output_dir == "runs/other"
    assert resolved.root.tracking.experiment == "g4-64"


def test_escaped_interpolation_stays_literal_through_save(write, tmp_path):
    resolved = load_config(write(BASE + "tracking: {experiment: 'a\\${b}'}\n"))
    assert resolved.root.tracking.experiment == "a${b}"
    again = load_config(resolved.save(tmp_path / "saved.yaml"))
    assert again.root.tracking.experiment == "a${b}"


# -- saving -----------------------------------------------------------------------------------


def test_save_and_reload_round_trip(write, registry, tmp_path):
    path = write(BASE + "stages:\n  - {name: rl, type: train}\n  - {name: test, type: eval}\n")
    resolved = load_config(path, ["trainer.lr=3e-5"], registry)
    saved = resolved.save(tmp_path / "out" / "config.yaml")
    again = load_config(saved, registry=registry)
    assert again.to_dict() == resolved.to_dict()
    assert again.to_dict()["trainer"]["lr"] == 3e-5
    assert [s.config.to_dict() for s in expand_stages(again)] == [
        s.config.to_dict() for s in expand_stages(resolved)
    ]


# -- stages -------------------------------------------------------------------------------------


STAGES = """\
stages:
  - name: sft
    type: train
    algorithm: {name: sft}
    trainer: {steps: 5}
  - name: rl
    type: train
    algorithm: {kl_coef: 0.05}
    env: {levels: [Open]}
  - {name: test, type: eval, eval: {k: 4}}
"""
PIPELINE = BASE + STAGES


def test_no_stages_is_one_train_stage(write, registry):
    resolved = load_config(write(BASE), registry=registry)
    (stage,) = expand_stages(resolved)
    assert (stage.name, stage.type) == ("train", "train")
    assert stage.config.to_dict() == resolved.to_dict()


def test_stages_merge_their_overrides(write, registry):
    stages = expand_stages(load_config(write(PIPELINE), registry=registry))
    sft, rl, test = (s.config for s in stages)
    assert [s.type for s in stages] == ["train", "train", "eval"]
    assert sft.components["algorithm"][1] == SFTOptions()  # grpo options not carried over
    assert sft.root.trainer.steps == 5 and sft.root.trainer.group_size == 4
    assert rl.components["algorithm"][1] == GRPOOptions(kl_coef=0.05)
    assert rl.components["env"][1].levels == ["Open"]
    assert rl.root.trainer.steps == 10
    assert test.root.eval.k == 4
    assert [c.root.run.output_dir for c in (sft, rl, test)] == [
        "runs/demo/sft",
        "runs/demo/rl",
        "runs/demo/test",
    ]
    assert all(c.root.stages is None for c in (sft, rl, test))


def test_stage_may_set_its_own_output_dir(write):
    path = write(BASE + "stages: [{name: a, type: train, run: {output_dir: elsewhere}}]\n")
    assert expand_stages(load_config(path))[0].config.root.run.output_dir == "elsewhere"


def test_stage_errors_name_the_stage(write, registry):
    path = write(PIPELINE.replace("kl_coef: 0.05", "kl_coef: -1"))
    message = errors_of(path, registry=registry)
    assert "stages.1.algorithm.kl_coef: Input should be greater than or equal to 0" in message
    message = errors_of(write(PIPELINE), ["stages.0.trainer.steps=-2"], registry)
    assert "stages.0.trainer.steps: Input should be greater than 0 (got -2)" in message


def test_stage_shape_errors(write, registry):
    text = BASE + "stages:\n  - {name: a, type: tune}\n  - {name: a, type: eval, trainr: {}}\n"
    message = errors_of(write(text))
    assert "stages.1.trainr: unknown key (did you mean 'trainer'?)" in message
    text = BASE + "stages:\n  - {name: a, type: tune}\n  - {name: b, type: eval}\n"
    message = errors_of(write(text), registry=registry)
    assert (
        "stages.0.type: unknown stage type 'tune'; registered: eval, evolve, offline, train"
        in message
    )
    message = errors_of(write(BASE + "stages: [{name: a, type: eval}, {name: a, type: eval}]\n"))
    assert "stages: stage names must be unique" in message


def test_train_stage_needs_algorithm_and_scheduler(write, registry):
    text = "model: {path: m}\nenv: {name: grid}\neval: {max_turns: 3}\n"
    stages = "stages: [{name: a, type: eval}, {name: b, type: train}]\n"
    message = errors_of(write(text + stages), registry=registry)
    assert "stages.1.algorithm: a train stage needs algorithm" in message
    assert "stages.1.scheduler: a train stage needs scheduler" in message
    assert "stages.0" not in message


# -- every shipped config loads -------------------------------------------------------------------


def _shipped() -> list:
    files = sorted(CONFIGS.glob("**/*.yaml")) + sorted(CONFIGS.glob("**/*.yml"))
    # accelerate's launch configs, not agentgym's: test_distributed.py checks them
    files = [f for f in files if CONFIGS / "accelerate" not in f.parents]
    if not files:
        reason = f"no YAML under {CONFIGS.name}/ yet: nothing shipped to check"
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="none")]
    return [pytest.param(f, id=str(f.relative_to(CONFIGS))) for f in files]


def _installed_registry() -> Registry | None:
    try:
        from agentgym_core.plugins import PluginHost
    except ImportError:
        return None
    return PluginHost().registry


@pytest.mark.parametrize("path", _shipped())
def test_shipped_config_loads(path):
    resolved = load_config(path, registry=_installed_registry())
    assert expand_stages(resolved)
    first = path.read_text().lstrip().splitlines()[0]
    assert first.startswith("#") and "agentgym" in first, "open with the command that runs it"
