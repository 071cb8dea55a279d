"""Constrained decoding's cost on the search env's span actions: the scan we ship against a trie.

`ActionConstraint` answers, at every sampled token, which token ids keep the
prefix on an allowed action, by scanning every action's token sequence. A trie
answers each token from one node, but is built per request, and a request walks
one action. This plays, for the first `--tasks` train questions after a search
(`action_space: spans`), every listed action's token sequence through a fresh
constraint of each kind (the real SmolLM2 tokenizer, `agentgym model fetch`),
interleaved, and prints actions, tokens walked and seconds of each.

    .venv/bin/python benchmarks/action_trie.py --tasks 8 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class TrieConstraint:
    """The contender: a token trie built once per request, walked as tokens come."""

    def __init__(self, actions, sequences) -> None:
        self.root: dict = {}
        for sequence in sequences:
            node = self.root
            for token in sequence:
                node = node.setdefault(token, {})
        self.node: dict | None = self.root

    def allowed(self) -> tuple[int, ...]:
        return () if self.node is None else tuple(sorted(self.node))

    def advance(self, token_id: int) -> None:
        self.node = None if self.node is None else self.node.get(int(token_id))


def action_lists(tasks: int) -> list[list[str]]:
    """Each of the first `tasks` train questions' actions after searching its subject."""
    from agentgym_env_search import SearchConfig
    from agentgym_env_search.env import SearchEnv

    env = SearchEnv(SearchConfig(action_space="spans"))
    lists = []
    try:
        for task in list(env.tasks("train"))[:tasks]:
            env.reset(task)
            first = env.valid_actions()
            env.step(next(a for a in first if a.startswith("search[")))
            lists.append(env.valid_actions())
    finally:
        env.close()
    return lists


def walk(constraint_class, actions, sequences) -> int:
    """Every action's tokens through a fresh constraint, asking `allowed` at each token."""
    steps = 0
    for sequence in sequences:
        constraint = constraint_class(actions, sequences)
        for token in sequence:
            assert token in constraint.allowed()
            constraint.advance(token)
            steps += 1
    return steps


def main() -> None:
    """Time both over the same action lists, interleaved, and print a table."""
    from transformers import AutoTokenizer

    from agentgym_core.modeling.fetch import fetch
    from agentgym_core.policies.constraints import ActionConstraint
    from agentgym_core.rollout.chat import ChatFormat

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    chat = ChatFormat(AutoTokenizer.from_pretrained(fetch("smollm2-135m-instruct")))
    lists = [(a, [chat.action_tokens(x) for x in a]) for a in action_lists(args.tasks)]
    times: dict[str, list[float]] = {"scan (ActionConstraint)": [], "trie": []}
    steps = 0
    for _ in range(args.repeats):
        for name, cls in (("scan (ActionConstraint)", ActionConstraint), ("trie", TrieConstraint)):
            start = time.perf_counter()
            steps = sum(walk(cls, actions, sequences) for actions, sequences in lists)
            times[name].append(time.perf_counter() - start)
    counts = [len(actions) for actions, _ in lists]
    print(f"{len(lists)} action lists, {min(counts)}-{max(counts)} actions, {steps} tokens walked")
    print("| constraint | seconds (median) | us per token | vs scan |")
    print("| --- | --- | --- | --- |")
    scan = statistics.median(times["scan (ActionConstraint)"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.3f} | {median / steps * 1e6:.1f} | {scan / median:.1f}x |")


if __name__ == "__main__":
    main()
