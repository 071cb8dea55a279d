"""The search environment on the real default corpus (the OVOS Wikipedia summaries)."""

from __future__ import annotations

import random

import pytest
from agentgym_env_search import SearchConfig, SearchEnv
from agentgym_env_search.env import INVALID, OVER, parse_action, shorten
from agentgym_env_search.metrics import normalize_answer

from agentgym_core.testing import check_environment


def test_protocol_conformance(search_cache):
    env = SearchEnv(SearchConfig(cache_dir=str(search_cache)))
    # Actions are open text, so the checker plays "look" (invalid): no episode ends.
    with pytest.warns(UserWarning, match="no episode ended"):
        check_environment(env, num_tasks=4, max_steps=5)


def test_splits_are_deterministic_disjoint_and_cover_both_groups(default_env, search_cache):
    train, test = default_env.tasks("train"), default_env.tasks("test")
    again = SearchEnv(SearchConfig(cache_dir=str(search_cache)))
    assert train == again.tasks("train") and test == again.tasks("test")
    assert not set(train) & set(test)
    assert sorted(train + test) == list(range(len(default_env.items)))
    assert 0.12 < len(test) / len(default_env.items) < 0.28  # test_fraction 0.2, by hash
    for split in (train, test):
        groups = [default_env.task_group(t) for t in split]
        assert groups.count("single") >= 0.3 * len(split)
        assert groups.count("multi") >= 0.3 * len(split)
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        default_env.tasks("dev")


def test_test_fraction_moves_questions_between_splits_only_one_way(search_cache):
    small = SearchEnv(SearchConfig(cache_dir=str(search_cache), test_fraction=0.1))
    large = SearchEnv(SearchConfig(cache_dir=str(search_cache), test_fraction=0.3))
    assert set(small.tasks("test")) < set(large.tasks("test"))


def test_expert_solves_every_sampled_test_question(default_env):
    tasks = random.Random(0).sample(default_env.tasks("test"), 40)
    for task in tasks:
        default_env.reset(task)
        searches = 0
        for _ in range(10):
            action = default_env.expert_action()
            result = default_env.step(action)
            searches += action.startswith("search[")
            if result.done:
                break
        assert result.done and result.reward == 1.0 and result.info["f1"] == 1.0, task
        hops = len(default_env.items[task].supporting_titles)
        assert searches == hops and (hops > 1) == (default_env.task_group(task) == "multi")


def test_search_shows_top_k_passages_with_titles(search_cache):
    env = SearchEnv(SearchConfig(cache_dir=str(search_cache), top_k=2, max_passage_chars=120))
    env.reset(env.tasks("train")[0])
    result = env.step("I should look this up. search[Charlie Chaplin]")
    lines = result.observation.splitlines()
    assert lines[0] == "Results of search[Charlie Chaplin]:"
    assert len(lines) == 3 and lines[1].startswith("(1) Charlie Chaplin: ")
    assert result.info["titles"][0] == "Charlie Chaplin" and len(result.info["titles"]) == 2
    assert all(len(line.split(": ", 1)[1]) <= 120 for line in lines[1:])
    assert result.reward == 0.0 and not result.done


def test_answer_ends_the_episode_with_exact_match_reward(default_env):
    task = next(
        t
        for t in default_env.tasks("test")
        if default_env.items[t].kind == "creator"
        and len(normalize_answer(default_env.items[t].answers[0]).split()) >= 2
    )
    gold = default_env.items[task].answers[0]  # e.g. "Stanley Kubrick"
    default_env.reset(task)
    result = default_env.step(f"answer[{gold.upper()}.]")
    assert result.done and result.reward == 1.0 and result.info["em"] == 1.0
    assert default_env.step("search[anything]").observation == OVER
    default_env.reset(task)
    surname = gold.split()[-1]
    result = default_env.step(f"answer[{surname}]")
    words = len(normalize_answer(gold).split())  # recall 1/words, precision 1
    assert result.done and result.reward == 0.0 and not result.info["success"]
    assert result.info["f1"] == pytest.approx(2 * (1 / words) / (1 + 1 / words))


def test_invalid_and_empty_actions_get_helpful_observations(default_env):
    default_env.reset(default_env.tasks("train")[0])
    result = default_env.step("Paris is my guess")
    assert result.observation == INVALID and not result.done and result.reward == 0.0
    result = default_env.step("search[   ]")
    assert "needs text inside the brackets" in result.observation and not result.done
    result = default_env.step("search[zzqxv qqqzx]")
    assert result.observation.startswith("No passage matches") and result.info["titles"] == []


def test_parse_action_takes_the_last_tool_call():
    assert parse_action("search[a] then ANSWER[ New  York ]") == ("answer", "New York")
    assert parse_action("Thought: x.\nAction: search[Marie\nCurie]") == ("search", "Marie Curie")
    assert parse_action("search Marie Curie") is None
    assert parse_action("research[x]") is None


def test_shorten_cuts_at_a_word_boundary():
    assert shorten("short text", 20) == "short text"
    assert shorten("alpha beta gamma delta", 16) == "alpha beta..."
    assert len(shorten("word " * 100, 80)) <= 80


def test_custom_corpus_without_questions_is_a_config_error():
    with pytest.raises(ValueError, match="corpus_path is set but qa_path is not"):
        SearchConfig(corpus_path="my.jsonl")
