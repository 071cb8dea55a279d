"""The bundled questions: reachable by the oracle, linked hop to hop, regenerated exactly."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
from agentgym_env_search import SearchConfig, SearchEnv
from agentgym_env_search.corpus import CorpusError, load_corpus
from agentgym_env_search.env import shorten
from agentgym_env_search.index import Searcher, cache_key
from agentgym_env_search.qa import BUNDLED, QAError, load_qa

MAKE_QA = Path(__file__).parents[1] / "scripts" / "make_qa.py"


def shown(env: SearchEnv, title: str) -> str:
    """What a search result shows of the passage `title` (title line and cut text)."""
    corpus = env.searcher.corpus
    passage = corpus.passages[corpus.index_of(title)]
    return f"{passage.title}: {shorten(passage.text, env.config.max_passage_chars)}".lower()


def test_every_answer_is_reachable_with_the_oracle_queries(default_env):
    """Each supporting title is in the top-k for its own query; the answer is in what is shown."""
    assert len(default_env.items) >= 300
    for item in default_env.items:
        for title in item.supporting_titles:
            hits = default_env.searcher.search(title, default_env.config.top_k)
            titles = [default_env.searcher.passage(h).title for h in hits]
            assert title in titles, (item.question, title, titles)
        texts = [shown(default_env, t) for t in item.supporting_titles]
        assert any(item.answers[0].lower() in text for text in texts), item.question


def test_each_hop_is_named_by_the_question_or_an_earlier_passage(default_env):
    """A multi-hop question can be followed by reading: no hop needs the answer in advance."""
    multi = [item for item in default_env.items if item.group == "multi"]
    assert {item.kind for item in multi} == {
        "creator_birth_year",
        "creator_death_year",
        "place_capital",
        "born_first",
        "creator_born_first",
    }
    for item in multi:
        first, *later = item.supporting_titles
        texts = [shown(default_env, t) for t in item.supporting_titles]
        if item.kind == "place_capital":
            # place -> its country -> the city whose description calls it that country's capital
            country = re.match(r"[^:]+: capital[^.]*? (?:of|in) (?:the )?([^.]+?)\.", texts[1])
            assert country and country[1] in texts[0], item.question
            continue
        for index, title in enumerate(later, start=1):
            name = re.sub(r" \([^)]*\)$", "", title).lower()  # "Leviathan (Hobbes book)"
            earlier = [item.question.lower(), *texts[:index]]
            assert any(name in text for text in earlier), (item.question, title)


def test_answers_are_short_and_single_hop_answers_sit_in_their_passage(default_env):
    for item in default_env.items:
        assert len(item.answers[0].split()) <= 5 and len(item.answers[0]) <= 40, item.answers
        if item.group == "single":
            assert item.answers[0].lower() in shown(default_env, item.supporting_titles[0])


@pytest.mark.parametrize("question_set", ["facts", "arithmetic", "lifespans"])
def test_make_qa_regenerates_the_shipped_file(search_cache, monkeypatch, question_set):
    spec = importlib.util.spec_from_file_location("make_qa", MAKE_QA)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "make_qa", module)  # dataclasses look their module up
    spec.loader.exec_module(module)
    items = module.build(search_cache, question_set)
    shipped = load_qa(BUNDLED[question_set], load_corpus(None))
    assert items == shipped


def test_arithmetic_answers_are_computed_from_numbers_the_passages_show(search_cache):
    """The answer is no passage's text: it is the program's result over shown years."""
    env = SearchEnv(SearchConfig(cache_dir=str(search_cache), question_set="arithmetic"))
    assert len(env.items) == 200 and len(env.tasks("test")) >= 30
    assert {item.kind for item in env.items} == {
        "lifespan",
        "birth_gap",
        "creator_age_at_work",
        "creator_lifespan",
    }
    read = 0
    for item in env.items:
        left, right = re.fullmatch(r"print\((?:abs\()?(\d+) - (\d+)\)?\)", item.program).groups()
        assert abs(int(left) - int(right)) == int(item.answers[0]), item.program
        texts = " ".join(shown(env, t) for t in item.supporting_titles)
        assert left in texts and right in texts, item.question
        read += item.answers[0] in texts
    assert read < len(env.items) / 2  # mostly not stated anywhere: it must be computed


def test_lifespans_ask_one_question_per_person_and_keep_test_people_out_of_train(search_cache):
    """Each person is asked about once, so a test question's person is never seen in training."""
    env = SearchEnv(SearchConfig(cache_dir=str(search_cache), question_set="lifespans"))
    assert len(env.items) > 1000 and {item.kind for item in env.items} == {"lifespan"}
    people = [item.supporting_titles[0] for item in env.items]
    assert len(set(people)) == len(people)
    test = {people[t] for t in env.tasks("test")}
    train = {people[t] for t in env.tasks("train")}
    assert len(test) > 150 and not test & train
    for item in env.items:
        died, born = re.fullmatch(r"print\((\d+) - (\d+)\)", item.program).groups()
        assert int(died) - int(born) == int(item.answers[0])
        assert died in shown(env, item.supporting_titles[0]) and born in shown(
            env, item.supporting_titles[0]
        )


def test_index_cache_is_reused_and_keyed_by_corpus(tmp_path):
    corpus_file = tmp_path / "corpus.jsonl"
    corpus_file.write_text(
        '{"title": "Zorblat", "text": "Zorblat is a made-up river that flows into Lake Quimby."}\n'
        '{"title": "Lake Quimby", "text": "Lake Quimby is a made-up lake in the land of Vosk."}\n'
    )
    cache = tmp_path / "cache"
    first = Searcher(load_corpus(corpus_file), cache)
    second = Searcher(load_corpus(corpus_file), cache)
    assert first.built and not second.built
    assert [h.index for h in second.search("quimby lake", 2)] == [1, 0]
    corpus_file.write_text(corpus_file.read_text().replace("Vosk", "Tarn"))
    changed = load_corpus(corpus_file)
    assert cache_key(changed) != cache_key(first.corpus)
    assert Searcher(changed, cache).built
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        [cache_key(first.corpus), cache_key(changed)]
    )


def test_custom_corpus_and_questions_play_end_to_end(tmp_path):
    corpus_file, qa_file = tmp_path / "corpus.jsonl", tmp_path / "qa.jsonl"
    corpus_file.write_text(
        '{"title": "Zorblat", "text": "Zorblat is a made-up river that flows into Lake Quimby."}\n'
        '{"title": "Lake Quimby", "text": "Lake Quimby is a made-up lake in the land of Vosk."}\n'
    )
    qa_file.write_text(
        '{"question": "Zorblat flows into a lake in which land?", "answers": ["Vosk"], '
        '"supporting_titles": ["Zorblat", "Lake Quimby"]}\n'
        '{"question": "Into which lake does Zorblat flow?", "answers": ["Lake Quimby"], '
        '"supporting_titles": ["Zorblat"]}\n'
    )
    config = SearchConfig(
        corpus_path=str(corpus_file),
        qa_path=str(qa_file),
        cache_dir=str(tmp_path / "c"),
        test_fraction=0.5,
    )
    env = SearchEnv(config)
    assert sorted(env.tasks("train") + env.tasks("test")) == [0, 1]
    assert [env.task_group(0), env.task_group(1)] == ["multi", "single"]
    env.reset(0)
    assert env.expert_action() == "search[Zorblat]"
    assert "(1) Zorblat: Zorblat is a made-up river" in env.step("search[Zorblat]").observation
    assert env.expert_action() == "search[Lake Quimby]"
    env.step(env.expert_action())
    result = env.step(env.expert_action())
    assert result.done and result.reward == 1.0 and result.info["searches"] == 2


def test_bad_corpus_and_question_files_name_file_line_and_field(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "A", "text": "a"}\n{"title": "B"}\n')
    with pytest.raises(CorpusError, match=r"bad.jsonl:2: field 'text' must be a non-empty string"):
        load_corpus(bad)
    bad.write_text('{"title": "A", "text": "a"}\n{"title": "A", "text": "b"}\n')
    with pytest.raises(CorpusError, match=r"bad.jsonl:2: title 'A' repeats line 1"):
        load_corpus(bad)
    with pytest.raises(CorpusError, match="no such file"):
        load_corpus(tmp_path / "missing.jsonl")
    bad.write_text('{"title": "A", "text": "alpha"}\n')
    corpus = load_corpus(bad)
    qa = tmp_path / "qa.jsonl"
    qa.write_text('{"question": "q?", "answers": ["alpha"], "supporting_titles": ["Nope"]}\n')
    with pytest.raises(QAError, match=r"qa.jsonl:1: supporting title\(s\) \['Nope'\]"):
        load_qa(qa, corpus)
    qa.write_text('{"question": "q?", "answers": []}\n')
    with pytest.raises(QAError, match=r"qa.jsonl:1: answers: .*at least 1"):
        load_qa(qa, corpus)
    qa.write_text('{"question": "q?", "answers": ["a"]}\n{"question": "q?", "answers": ["b"]}\n')
    with pytest.raises(QAError, match=r"qa.jsonl:2: the question repeats line 1"):
        load_qa(qa, corpus)
