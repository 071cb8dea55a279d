"""Fixtures of the search tests: one BM25 index cache per session, outside the user's cache."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def search_cache(tmp_path_factory) -> Path:
    """A session-wide index cache folder: the default corpus is indexed once per session."""
    return tmp_path_factory.mktemp("search-index-cache")


@pytest.fixture(scope="session")
def default_env(search_cache):
    """The search env on the default corpus and bundled questions."""
    from agentgym_env_search import SearchConfig, SearchEnv

    env = SearchEnv(SearchConfig(cache_dir=str(search_cache)))
    yield env
    env.close()
