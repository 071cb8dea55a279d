"""The `spans` action space: the listed actions, worked out by hand, and the expert inside them."""

from __future__ import annotations

import pytest
from agentgym_env_search import SearchConfig, SearchEnv
from agentgym_env_search.spans import differences, span_actions, spans, words


def test_words_keep_names_whole():
    text = "(1) J. Robert Oppenheimer: Al-Shafi'i (born 767) met Dr. Who in the U.S. in 1904."
    assert words(text) == [
        "1", "J.", "Robert", "Oppenheimer", "Al-Shafi'i", "born", "767", "met", "Dr.", "Who",
        "in", "the", "U.S", "in", "1904",
    ]  # fmt: skip


def test_spans_are_every_run_up_to_the_limit_within_one_text():
    assert spans(["a b c", "c d"], 2) == ["a", "a b", "b", "b c", "c", "c d", "d"]
    assert "c c" not in spans(["a b c", "c d"], 3)  # never across texts
    assert spans(["a b c"], 1) == ["a", "b", "c"]


def test_differences_pair_distinct_numbers_larger_first():
    assert differences(["born 1897, died 1973", "aged 76, 1897"]) == [
        "print(1973 - 1897)",
        "print(1973 - 76)",
        "print(1897 - 76)",
    ]
    assert differences(["no numbers here"]) == []


def test_span_actions_lists_search_answer_then_python():
    assert span_actions(["x 2", "1"], 1, python=True) == [
        "search[x]", "search[2]", "search[1]", "answer[x]", "answer[2]", "answer[1]",
        "python[print(2 - 1)]",
    ]  # fmt: skip
    assert not any(a.startswith("python[") for a in span_actions(["1 2"], 1, python=False))


@pytest.fixture(scope="module")
def spans_env(search_cache):
    config = SearchConfig(
        cache_dir=str(search_cache),
        question_set="lifespans",
        python=True,
        top_k=1,
        action_space="spans",
    )
    env = SearchEnv(config)
    yield env
    env.close()


def test_actions_follow_what_the_agent_read(spans_env, default_env):
    env = spans_env
    assert default_env.valid_actions() is None  # free text by default
    env.reset(env.tasks("test")[0])
    name = env.item.supporting_titles[0]
    first = env.valid_actions()
    assert f"search[{name}]" in first and f"answer[{name}]" in first
    assert not any(a.startswith("python[") for a in first)  # no number read yet
    env.step(f"search[{name}]")
    assert f"python[{env.item.program}]" in env.valid_actions()
    env.step(f"python[{env.item.program}]")
    assert f"answer[{env.item.answers[0]}]" in env.valid_actions()


def test_the_expert_stays_inside_the_list_on_nearly_every_question(spans_env):
    """Chosen with the scenario: names of 5+ words and years the passage hides fall outside."""
    env = spans_env
    tasks = env.tasks("test")
    inside = 0
    for task in tasks:
        env.reset(task)
        while not env.done:
            action = env.expert_action()
            if action not in env.valid_actions():
                break
            env.step(action)
        inside += env.success
    assert inside / len(tasks) > 0.97
