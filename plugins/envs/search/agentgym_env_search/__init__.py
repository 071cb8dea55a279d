"""Deep search QA: search[...] over a local BM25 index, answer[...] scored by exact match."""

from agentgym_env_search.config import SearchConfig
from agentgym_env_search.env import SearchEnv

__all__ = ["SearchConfig", "SearchEnv"]
