"""Wrong return types from an env stop every command that plays it, naming env, method and fix.

Each broken env below is registered as an inline plugin and driven through the
real commands (`agentgym env play`, `model init`, `data expert`, an SFT stage
with expert data) in-process: a clean one-line error and a non-zero exit,
never a traceback, an `Observation: None`, or a `"value": null` turn.
"""

from __future__ import annotations

import io
import json
import sys

import pytest
import yaml
from pydantic import BaseModel

from agentgym_core import cli, env_options, hookimpl
from agentgym_core.cli import main
from agentgym_core.rollout import contract
from agentgym_core.rollout.contract import EnvironmentContractError
from agentgym_core.testing import EnvironmentCheckError, check_environment
from agentgym_core.types import StepResult

COLOURS = ("red", "green", "blue")
GYMNASIUM_FIX = "not a Gymnasium (obs, reward, terminated, truncated, info) tuple"


class Options(BaseModel):
    """No options."""


class SayColour:
    """Say the goal colour; an expert that always knows it. Correct in every way."""

    def __init__(self, config: Options | None = None) -> None:
        self.goal = "red"

    def tasks(self, split):
        return [0, 1, 2] if split == "train" else [3, 4]

    def instruction(self):
        return "Say the colour of the goal: `say <colour>`."

    def reset(self, task_id):
        self.goal = COLOURS[task_id % 3]
        return f"Goal: say {self.goal}."

    def step(self, action):
        ok = action == f"say {self.goal}"
        return StepResult("Correct." if ok else "Wrong.", float(ok), ok, info={"success": ok})

    def valid_actions(self):
        return [f"say {c}" for c in COLOURS]

    def task_group(self, task_id):
        return COLOURS[task_id % 3]

    def expert_action(self):
        return f"say {self.goal}"

    def close(self):
        pass


class NoneReset(SayColour):
    """Forgot the `return` in `reset`."""

    def reset(self, task_id):
        super().reset(task_id)


class GymStep(SayColour):
    """Ported from Gymnasium: `step` returns the 5-tuple."""

    def step(self, action):
        result = super().step(action)
        return result.observation, result.reward, result.done, False, {}


class BrokenEnvs:
    """An inline plugin: one correct env and two broken ones."""

    @hookimpl
    def agentgym_register_environments(self, register):
        register("say-colour", SayColour, config=Options)
        register("none-reset", NoneReset, config=Options)
        register("gym-step", GymStep, config=Options)


@pytest.fixture
def agentgym(monkeypatch, capsys, agentgym_plugin):
    """Run `agentgym ARGS` in-process with the broken envs installed; (exit code, out, err)."""
    host = agentgym_plugin(BrokenEnvs(), name="broken-envs")
    monkeypatch.setattr(cli, "plugin_host", lambda: host)
    monkeypatch.setattr(env_options, "plugin_host", lambda: host)

    def run(*args: str, stdin: str = "") -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
        code = main(list(args))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def one_error_line(err: str) -> str:
    """The stderr of a failed command: exactly one `agentgym: error:` line, no traceback."""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentgym: error: "), err
    return lines[0]


# -- the contract's messages -------------------------------------------------------------


def test_messages_name_the_registered_env_the_method_the_type_and_the_fix():
    env = NoneReset()
    with pytest.raises(EnvironmentContractError) as caught:
        contract.text(env, "reset", None, name="none-reset", task=2)
    message = str(caught.value)
    assert message.startswith("environment 'none-reset' (NoneReset), task 2: reset() must ")
    assert "got NoneType: None" in message
    assert "return the first observation" in message

    with pytest.raises(EnvironmentContractError) as caught:
        contract.step(env, ("Correct.", 1.0, True, False, {}), name="gym-step")
    message = str(caught.value)
    assert message.startswith("environment 'gym-step' (NoneReset): step() must ")
    assert "got tuple" in message
    assert f"return StepResult(observation, reward, done), {GYMNASIUM_FIX}" in message

    with pytest.raises(EnvironmentContractError) as caught:
        contract.actions(env, "say red", name="x")
    assert "got str" in str(caught.value) and "a list of action strings" in str(caught.value)


def test_without_a_name_the_message_names_the_class_and_its_module():
    with pytest.raises(EnvironmentContractError) as caught:
        contract.text(SayColour(), "instruction", 3)
    assert str(caught.value).startswith(f"environment SayColour ({__name__}): instruction() ")


def test_an_env_made_by_name_is_named_in_messages_of_callers_that_pass_no_name(agentgym_plugin):
    host = agentgym_plugin(BrokenEnvs(), name="broken-envs")
    env = env_options.make_env(host, "none-reset", [])
    with pytest.raises(EnvironmentContractError, match=r"^environment 'none-reset' \(NoneReset\)"):
        contract.text(env, "reset", env.reset(0))  # the engine's call: no name
    assert contract.text(env, "instruction", env.instruction()) == env.instruction()


def test_correct_values_pass_through_unchanged():
    env = SayColour()
    result = StepResult("ok", 1, True)
    assert contract.step(env, result, name="say-colour") is result
    assert contract.text(env, "task_group", None, optional=True) is None
    assert contract.actions(env, ("a", "b")) == ["a", "b"]


# -- every command that plays an env -------------------------------------------------------


def test_env_play_stops_at_a_none_observation(agentgym):
    code, out, err = agentgym("env", "play", "none-reset", stdin="say red\n")
    assert code == 2
    assert "Observation:\nNone" not in out
    line = one_error_line(err)
    assert "environment 'none-reset'" in line and "task 0: reset() must" in line
    assert "got NoneType" in line and "return the first observation" in line


def test_env_play_names_a_gymnasium_step_tuple(agentgym):
    code, _, err = agentgym("env", "play", "gym-step", stdin="1\n")
    assert code == 2
    line = one_error_line(err)
    assert "environment 'gym-step'" in line and "step() must" in line and GYMNASIUM_FIX in line


def test_env_play_of_a_correct_env_still_plays(agentgym):
    code, out, err = agentgym("env", "play", "say-colour", stdin="1\n")
    assert code == 0, err
    assert "Observation:\nGoal: say red." in out and "episode over: success after 1 turns" in out


@pytest.mark.parametrize(
    ("env", "detail"),
    [("none-reset", "got NoneType"), ("gym-step", GYMNASIUM_FIX)],
)
def test_model_init_stops_with_the_contract_error(agentgym, tmp_path, env, detail):
    out = tmp_path / "model"
    code, _, err = agentgym("model", "init", "--env", env, "--tasks", "2", "--out", str(out))
    assert code == 2
    line = one_error_line(err)
    assert f"environment {env!r}" in line and detail in line
    assert not out.exists()


@pytest.mark.parametrize(
    ("env", "detail"),
    [("none-reset", "task 0: reset() must"), ("gym-step", GYMNASIUM_FIX)],
)
def test_data_expert_writes_no_episode_from_a_broken_env(agentgym, tmp_path, env, detail):
    out = tmp_path / "expert.json"
    code, stdout, err = agentgym("data", "expert", env, "--episodes", "2", "--out", str(out))
    assert code != 0
    assert "success" not in stdout
    line = one_error_line(err)
    assert f"environment {env!r}" in line and "task 0" in line and detail in line
    assert not out.exists()


def test_data_expert_counts_episodes_as_a_whole_number(agentgym, tmp_path):
    out = tmp_path / "expert.json"
    code, stdout, err = agentgym(
        "data", "expert", "say-colour", "--episodes", "2", "--out", str(out)
    )
    assert code == 0, err
    assert stdout.startswith("2 episodes, success 1.00 -> ")
    items = json.loads(out.read_text())
    assert all(isinstance(turn["value"], str) for item in items for turn in item["conversations"])


@pytest.mark.parametrize("workers", [1, 2], ids=["one-process", "two-processes"])
@pytest.mark.parametrize("env", ["none-reset", "gym-step"])
def test_sft_expert_data_of_a_broken_env_stops_the_stage(
    agentgym, tmp_path, tiny_model_dir, env, workers
):
    expert = {"episodes": 2, "max_turns": 4, "workers": workers}
    config = {
        "run": {"name": "sft", "output_dir": str(tmp_path / "run"), "seed": 0},
        "model": {"path": str(tiny_model_dir)},
        "env": {"name": env},
        "algorithm": {"name": "sft", "expert": expert},
        "trainer": {"steps": 1, "checkpoint_every": 0},
        "eval": {"num_tasks": 2, "max_turns": 2},
    }
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(config))
    code, _, err = agentgym("train", str(path), "--no-progress")
    assert code == 2
    assert "Traceback" not in err
    error = err[err.index("agentgym: error: ") :]  # after the model's loading bars
    assert f"environment {env!r}" in error and "task 0" in error
    assert not (tmp_path / "run" / "sft" / "expert.json").exists()


# -- the test kit ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "check", "fix"),
    [(NoneReset, "reset", "return the first observation"), (GymStep, "step", GYMNASIUM_FIX)],
)
def test_check_environment_gives_the_contract_fix(cls, check, fix):
    with pytest.raises(EnvironmentCheckError) as caught:
        check_environment(cls())
    assert caught.value.check == check
    assert fix in caught.value.detail
