"""The search env's `python[code]` tool: parsed with its brackets, run in the real sandbox."""

from __future__ import annotations

import re

import pytest
from agentgym_env_search import SearchConfig, SearchEnv
from agentgym_env_search.env import INVALID, INVALID_WITH_PYTHON, parse_action


@pytest.fixture(scope="module")
def python_env(search_cache):
    env = SearchEnv(SearchConfig(cache_dir=str(search_cache), python=True, python_wall_s=5))
    yield env
    env.close()


def test_code_keeps_its_brackets_and_lines():
    code = "Action: python[xs = [1969, 1889]\nprint(xs[0] - xs[1])]"
    assert parse_action(code, python=True) == ("python", "xs = [1969, 1889]\nprint(xs[0] - xs[1])")
    assert parse_action("python[print(1)] then answer[80]", python=True) == ("answer", "80")
    assert parse_action("search[a] python[print(2)]", python=True) == ("python", "print(2)")
    assert parse_action("python[print(1)]") is None  # not offered: not an action
    assert parse_action("python[print(", python=True) is None


def test_python_computes_over_what_a_search_found(python_env):
    env = python_env
    assert "python[code]" in env.instruction() and "answer[text]" in env.instruction()
    env.reset(env.tasks("train")[0])
    found = env.step("search[Charlie Chaplin]").observation
    born = int(re.search(r"\b(18\d\d)\b", found).group(1))
    result = env.step(f"python[print(1977 - {born})]")
    assert result.observation == f"Python output:\n{1977 - born}"
    assert result.info["python_ok"] and not result.done and result.reward == 0.0
    answered = env.step("answer[wrong on purpose]")
    assert answered.done and answered.info["programs"] == 1 and answered.info["searches"] == 1


def test_errors_and_limits_come_back_as_observations(python_env):
    env = python_env
    env.reset(env.tasks("train")[0])
    assert env.step("python[1/0]").observation.endswith(
        "Error: ZeroDivisionError: division by zero"
    )
    escape = env.step("python[print(open('/etc/passwd').read())]")
    assert "FileNotFoundError" in escape.observation and not escape.info["python_ok"]
    slow = env.step("python[import time\ntime.sleep(30)]")
    assert slow.info["timed_out"] and "ran too long" in slow.observation
    assert env.step("python[   ]").observation.startswith("python[...] needs text")
    assert env.step("what now").observation == INVALID_WITH_PYTHON


def test_without_the_option_python_is_an_invalid_action(default_env):
    default_env.reset(default_env.tasks("train")[0])
    assert default_env.step("python[print(1)]").observation == INVALID
    assert "python" not in default_env.instruction()


def test_the_expert_computes_arithmetic_answers_with_python(search_cache):
    env = SearchEnv(
        SearchConfig(cache_dir=str(search_cache), question_set="arithmetic", python=True)
    )
    for task in env.tasks("test")[:6]:
        env.reset(task)
        actions, result = [], None
        while result is None or not result.done:
            actions.append(env.expert_action())
            result = env.step(actions[-1])
            if actions[-1].startswith("python["):
                assert result.observation == f"Python output:\n{env.items[task].answers[0]}"
        assert result.reward == 1.0 and result.info["programs"] == 1
        assert [a.split("[")[0] for a in actions][-2:] == ["python", "answer"]
    plain = SearchEnv(SearchConfig(cache_dir=str(search_cache), question_set="arithmetic"))
    plain.reset(plain.tasks("test")[0])
    actions = []
    while not actions or not actions[-1].startswith("answer["):  # no tool: it answers directly
        actions.append(plain.expert_action())
        result = plain.step(actions[-1])
    assert not any(a.startswith("python[") for a in actions) and result.reward == 1.0
