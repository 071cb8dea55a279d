"""Start-up cost of the search env: first build of the BM25 index vs loading the cached one.

    .venv/bin/python plugins/envs/search/scripts/bench_startup.py --repeats 5

Each measurement is a fresh interpreter that constructs `SearchEnv` on the
default corpus (read the corpus, build or load the index, read the questions)
and then runs every oracle query of the bundled questions once. *Cold* starts
with an empty cache folder (the index is built and saved); *warm* reuses the
folder a cold run filled. Prints medians over `--repeats` and warm/cold ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def child(cache_dir: str) -> dict[str, float]:
    """Construct the env with `cache_dir` and time its parts (milliseconds)."""
    from agentgym_env_search import SearchConfig, SearchEnv
    from agentgym_env_search.corpus import load_corpus

    start = time.perf_counter()
    load_corpus(None)
    corpus_ms = (time.perf_counter() - start) * 1000
    start = time.perf_counter()
    env = SearchEnv(SearchConfig(cache_dir=cache_dir))
    env_ms = (time.perf_counter() - start) * 1000
    queries = [t for item in env.items for t in item.supporting_titles]
    start = time.perf_counter()
    for query in queries:
        env.searcher.search(query, env.config.top_k)
    search_ms = (time.perf_counter() - start) * 1000 / len(queries)
    return {
        "corpus_ms": corpus_ms,
        "env_ms": env_ms,
        "search_ms": search_ms,
        "built": env.searcher.built,
    }


def run_child(cache_dir: str) -> dict[str, float]:
    """One measurement in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, __file__, "--child", cache_dir], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    """Alternate cold and warm starts, then print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    cold, warm = [], []
    with tempfile.TemporaryDirectory() as root:
        for i in range(args.repeats):
            cache = str(Path(root) / f"cache-{i}")
            cold.append(run_child(cache))
            warm.append(run_child(cache))
    assert all(r["built"] for r in cold) and not any(r["built"] for r in warm)
    rows = []
    for name, runs in (("cold (build index)", cold), ("warm (cached index)", warm)):
        median = {
            k: statistics.median(r[k] for r in runs) for k in ("corpus_ms", "env_ms", "search_ms")
        }
        rows.append((name, median))
    print("| start | env construction ms | of which reading the corpus ms | search ms/query |")
    print("|---|---|---|---|")
    for name, m in rows:
        print(f"| {name} | {m['env_ms']:.0f} | {m['corpus_ms']:.0f} | {m['search_ms']:.3f} |")
    ratio = rows[1][1]["env_ms"] / rows[0][1]["env_ms"]
    print(f"\nwarm / cold construction: {ratio:.2f}x ({args.repeats} repeats, medians)")


if __name__ == "__main__":
    main()
