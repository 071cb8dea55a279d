"""Question sets: a JSONL file of questions, gold answers and supporting passage titles.

Each line is `{"question": str, "answers": [str, ...], "supporting_titles":
[str, ...], "kind": str}`, with `"program": str` for a computed answer.
`supporting_titles` lists, in the order an oracle reads them, the passages
that hold the facts (one for a single-hop question, two or more for a
multi-hop one); `kind` names the template that wrote it.
The split of a question is a pure function of its text (a hash), so the
train/test split does not depend on the order or length of the file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agentgym_env_search.corpus import Corpus

DEFAULT_QA = Path(__file__).parent / "data" / "qa.jsonl"
"""Questions written for the default corpus by `scripts/make_qa.py`."""
ARITHMETIC_QA = Path(__file__).parent / "data" / "qa_arithmetic.jsonl"
"""Questions whose answer is computed from years the passages state (`make_qa.py --set
arithmetic`): they need python[...] or arithmetic done in the head."""
LIFESPANS_QA = Path(__file__).parent / "data" / "qa_lifespans.jsonl"
"""Every reachable "years between the birth and the death of X" question, one per person
(`make_qa.py --set lifespans`): enough different names to learn the procedure, not answers."""
BUNDLED = {"facts": DEFAULT_QA, "arithmetic": ARITHMETIC_QA, "lifespans": LIFESPANS_QA}
"""`question_set` -> the bundled file."""


class QAError(ValueError):
    """A question file is missing or malformed; the message names the file and line."""


class QAItem(BaseModel):
    """One question with its gold answers and the passages that support them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    question: str = Field(min_length=1, description="The question the agent must answer.")
    answers: list[str] = Field(
        min_length=1, description="Gold answers; the best exact match over them is the reward."
    )
    supporting_titles: list[str] = Field(
        default_factory=list,
        description="Titles of the passages holding the facts, in reading order; "
        "the expert searches for them. Two or more make the question multi-hop.",
    )
    kind: str = Field("", description="Template or source of the question, for reports.")
    program: str = Field(
        "",
        description="Python that prints the answer from the facts in the passages (arithmetic "
        "questions); the expert runs it with python[...] when the tool is offered.",
    )

    @field_validator("answers")
    @classmethod
    def _non_blank(cls, answers: list[str]) -> list[str]:
        if any(not a.strip() for a in answers):
            raise ValueError("answers must not be blank")
        return answers

    @property
    def group(self) -> str:
        """`multi` when the facts are spread over two or more passages, else `single`."""
        return "multi" if len(self.supporting_titles) > 1 else "single"


def load_qa(path: str | Path | None, corpus: Corpus) -> list[QAItem]:
    """Read a QA file (None: the bundled one); every supporting title must be in `corpus`."""
    source = DEFAULT_QA if path is None else Path(path)
    if not source.is_file():
        raise QAError(f"env.qa_path: no such file {str(source)!r}")
    items: list[QAItem] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(source.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            item = QAItem.model_validate_json(line)
        except ValidationError as error:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'line'}: {e['msg']}"
                for e in error.errors()
            )
            raise QAError(f"{where}: {problems}") from None
        missing = [t for t in item.supporting_titles if corpus.index_of(t) is None]
        if missing:
            raise QAError(
                f"{where}: supporting title(s) {missing} are not in the corpus {corpus.source}"
            )
        if item.question in seen:
            raise QAError(f"{where}: the question repeats line {seen[item.question]}")
        seen[item.question] = number
        items.append(item)
    if not items:
        raise QAError(f"{source} has no questions")
    return items


def split_of(question: str, test_fraction: float) -> str:
    """`test` for a stable `test_fraction` of questions (by sha256 of the text), else `train`."""
    digest = hashlib.sha256(question.encode("utf-8")).digest()
    position = int.from_bytes(digest[:8], "big") / 2**64
    return "test" if position < test_fraction else "train"


def dumps_qa(items: list[QAItem]) -> str:
    """Items as JSONL text, one object per line (stable key order)."""
    return "".join(
        json.dumps(
            item.model_dump(exclude=set() if item.program else {"program"}), ensure_ascii=False
        )
        + "\n"
        for item in items
    )
