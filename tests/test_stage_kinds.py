"""Stage kinds are registered like components: a plugin adds one, a pipeline runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from agentgym_core import hookimpl
from agentgym_core.api import StageContext, StageOutcome
from agentgym_core.config.errors import ConfigError
from agentgym_core.config.resolve import validate_dict
from agentgym_core.config.stages import expand_stages
from agentgym_core.numerics import flushing_now
from agentgym_core.run.pipeline import run_pipeline


class CopyOptions(BaseModel):
    """The options of the made-up `copy` kind."""

    model_config = ConfigDict(extra="forbid")
    label: str = Field(description="Written into the copy, so the test can tell stages apart.")


class CopyStage:
    """A stage kind that 'trains' by copying the weights it starts from and noting its label."""

    def __init__(self, context: StageContext, options: CopyOptions) -> None:
        self.context, self.options = context, options

    @staticmethod
    def check(config, prefix, earlier):
        from agentgym_core.config.errors import Problem

        if config.root.trainer.steps == 13:
            return [Problem(".".join(map(str, (*prefix, "trainer.steps"))), "unlucky")]
        return []

    def run(self, *, show_progress: bool = True, quiet: bool = False) -> StageOutcome:
        out = Path(self.context.config.root.run.output_dir) / "weights"
        out.mkdir(parents=True, exist_ok=True)
        chain = (self.context.start_model / "chain.txt").read_text()
        (out / "chain.txt").write_text(chain + self.options.label)
        (out / "name.txt").write_text(self.context.name)
        metrics = {"copied": float(len(chain) + 1), "flushing": float(flushing_now())}
        return StageOutcome(out, metrics=metrics)


class CopyKind:
    @hookimpl
    def agentgym_register_stage_kinds(self, register):
        register("copy", CopyStage, config=CopyOptions)


def _config(tmp_path: Path, stages: list[dict]) -> dict:
    start = tmp_path / "start"
    start.mkdir(exist_ok=True)
    (start / "chain.txt").write_text("s")
    return {
        "run": {"name": "kinds", "output_dir": str(tmp_path / "run")},
        "model": {"path": str(start)},
        "env": {"name": "babyai"},
        "eval": {"max_turns": 2},
        "stages": stages,
    }


def test_a_plugin_stage_kind_runs_in_a_pipeline_with_its_options(tmp_path, agentgym_plugin):
    host = agentgym_plugin(CopyKind(), name="copy-kind")
    assert "copy" in host.registry.names("stage")
    stages = [
        {"name": "one", "type": "copy", "options": {"label": "1"}},
        {"name": "two", "type": "copy", "options": {"label": "2"}},
    ]
    results = run_pipeline(
        validate_dict(_config(tmp_path, stages), host.registry), host, show_progress=False
    )
    assert [r.type for r in results] == ["copy", "copy"]
    assert (results[-1].model / "chain.txt").read_text() == "s12"  # each from the one before
    assert (results[-1].model / "name.txt").read_text() == "two"  # the stage's own name
    assert results[-1].metrics == {"copied": 3.0, "flushing": 1.0}  # subnormals flushed
    assert not flushing_now()  # within the stage only: this thread's state is as before


def test_stage_types_options_and_kind_checks_are_validated_before_anything_runs(
    tmp_path, agentgym_plugin
):
    host = agentgym_plugin(CopyKind(), name="copy-kind")
    stages = [
        {"name": "a", "type": "cpoy", "options": {"label": "x"}},
        {"name": "b", "type": "copy", "options": {"lable": "x"}},
        {"name": "c", "type": "eval", "options": {"label": "x"}},
        {"name": "d", "type": "copy", "options": {"label": "x"}, "trainer": {"steps": 13}},
    ]
    with pytest.raises(ConfigError) as raised:
        expand_stages(validate_dict(_config(tmp_path, stages), host.registry))
    message = str(raised.value)
    assert "stages.0.type: unknown stage type 'cpoy'" in message
    assert "did you mean 'copy'" in message
    assert "stages.1.options.lable: unknown key" in message
    assert "stages.2.options.label: unknown key" in message  # the core's kinds take none
    assert "stages.3.trainer.steps: unlucky" in message
    assert not (tmp_path / "run").exists()


def test_an_offline_stage_needs_an_offline_algorithm(tmp_path, agentgym_host):
    stages = [{"name": "o", "type": "offline", "algorithm": {"name": "grpo"}}]
    with pytest.raises(ConfigError, match=r"stages\.0\.algorithm\.name: an offline stage"):
        expand_stages(validate_dict(_config(tmp_path, stages), agentgym_host.registry))


def test_the_core_registers_its_kinds(agentgym_host):
    assert {"train", "offline", "eval", "evolve"} <= set(agentgym_host.registry.names("stage"))


def test_a_rerun_pipeline_takes_finished_stages_from_their_records(
    tmp_path, agentgym_plugin, capsys
):
    host = agentgym_plugin(CopyKind(), name="copy-kind")
    stages = [
        {"name": "one", "type": "copy", "options": {"label": "1"}},
        {"name": "two", "type": "copy", "options": {"label": "2"}},
    ]
    config = _config(tmp_path, stages)
    first = run_pipeline(validate_dict(config, host.registry), host, show_progress=False)
    copied = first[-1].model / "chain.txt"
    copied.write_text("marked")  # a stage that ran again would write s12 back

    again = run_pipeline(validate_dict(config, host.registry), host, show_progress=False)
    assert copied.read_text() == "marked"
    assert [(r.model, r.metrics, r.seconds) for r in again] == [
        (r.model, r.metrics, r.seconds) for r in first
    ]
    assert "[two] finished earlier" in capsys.readouterr().out

    stages[1]["options"]["label"] = "3"  # a changed config runs that stage again
    run_pipeline(validate_dict(config, host.registry), host, show_progress=False)
    assert copied.read_text() == "s13"

    (tmp_path / "start" / "chain.txt").write_text("t")  # new start weights run both again
    run_pipeline(validate_dict(config, host.registry), host, show_progress=False)
    assert copied.read_text() == "t13"

    config["trainer"] = {"resume": False}  # a fresh start is asked for: everything runs
    copied.write_text("marked")
    run_pipeline(validate_dict(config, host.registry), host, show_progress=False)
    assert copied.read_text() == "t13"
