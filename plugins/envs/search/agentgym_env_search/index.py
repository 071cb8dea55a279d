"""BM25 retrieval over a corpus with `bm25s`, cached on disk by corpus digest.

Building the index of the default 10k passages takes seconds; loading the
cached one takes a fraction of that. The cache key is the corpus digest plus
everything that changes the index (tokenizer, BM25 parameters, bm25s
version), so a changed corpus or setting never reads a stale index. Every
environment instance in a process shares one `Searcher` (`shared_searcher`):
the rollout engine makes one instance per concurrent episode.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import re
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agentgym_env_search.corpus import Corpus, Passage, load_corpus

INDEX_VERSION = "bm25-lucene-k1.5-b0.75-en-stem-title2-v1"
"""Names the tokenizer, document layout and BM25 settings below; part of the cache key."""
K1, B = 1.5, 0.75
_TOKEN = re.compile(r"\w+")
_local = threading.local()  # PyStemmer stemmers are not thread-safe: one per thread


def _stemmer():
    if not hasattr(_local, "stemmer"):
        import Stemmer

        _local.stemmer = Stemmer.Stemmer("english")
    return _local.stemmer


def _stopwords() -> frozenset[str]:
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


_STOPWORDS = _stopwords()


def tokenize(text: str) -> list[str]:
    """Lowercased word tokens, English stopwords removed, Snowball-stemmed."""
    words = [w for w in _TOKEN.findall(text.lower()) if w not in _STOPWORDS]
    return _stemmer().stemWords(words)


def default_cache_dir() -> Path:
    """`$AGENTGYM_CACHE/search`, else `$XDG_CACHE_HOME/agentgym/search`, else ~/.cache/..."""
    if os.environ.get("AGENTGYM_CACHE"):
        return Path(os.environ["AGENTGYM_CACHE"]) / "search"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "agentgym" / "search"


def cache_key(corpus: Corpus) -> str:
    """Folder name of a corpus's index: changes with the corpus or any index setting."""
    parts = [corpus.digest, INDEX_VERSION, md.version("bm25s"), md.version("PyStemmer")]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Hit:
    """One search result: the passage's position in the corpus and its BM25 score."""

    index: int
    score: float


class Searcher:
    """A corpus and its BM25 index; `search` is safe to call from many threads."""

    def __init__(self, corpus: Corpus, cache_dir: Path | None = None) -> None:
        self.corpus = corpus
        self.cache_dir = cache_dir if cache_dir is not None else default_cache_dir()
        self.index_dir = self.cache_dir / cache_key(corpus)
        self.built = False
        """True when this instance built the index rather than loading it from the cache."""
        self.retriever = self._load_or_build()

    def _load_or_build(self):
        import bm25s

        if (self.index_dir / "params.index.json").is_file():
            return bm25s.BM25.load(str(self.index_dir), show_progress=False)
        retriever = bm25s.BM25(k1=K1, b=B, method="lucene")
        # The title counts twice, so searching an article's name finds it among
        # passages that mention the name often (4.5% of titles miss the top 3 with
        # the title once, 3.1% with it twice, on the default corpus).
        documents = [tokenize(f"{p.title} {p.title} {p.text}") for p in self.corpus.passages]
        retriever.index(documents, show_progress=False)
        self._save(retriever)
        self.built = True
        return retriever

    def _save(self, retriever) -> None:
        """Write to a temporary folder, then rename: readers never see half an index."""
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.cache_dir))
        try:
            retriever.save(str(tmp), show_progress=False)
            os.rename(tmp, self.index_dir)
        except OSError:
            if not (self.index_dir / "params.index.json").is_file():
                raise  # not a lost race with another process: a real failure
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def search(self, query: str, k: int) -> list[Hit]:
        """The `k` best passages with a positive score, best first; ties go to the earlier one."""
        ids = self.retriever.get_tokens_ids(tokenize(query))
        if not ids:
            return []
        scores = np.asarray(self.retriever.get_scores_from_ids(ids), dtype=np.float64)
        order = np.lexsort((np.arange(len(scores)), -scores))[:k]
        return [Hit(int(i), float(scores[i])) for i in order if scores[i] > 0]

    def passage(self, hit: Hit) -> Passage:
        """The passage of a hit."""
        return self.corpus.passages[hit.index]


_shared: dict[tuple[str, str], Searcher] = {}
_shared_lock = threading.Lock()


def shared_searcher(corpus_path: str | None, cache_dir: str | None) -> Searcher:
    """One `Searcher` per (corpus file, cache folder) in this process, built on first use."""
    key = (str(corpus_path), str(cache_dir))
    with _shared_lock:
        if key not in _shared:
            corpus = load_corpus(corpus_path)
            _shared[key] = Searcher(corpus, Path(cache_dir) if cache_dir else None)
        return _shared[key]
