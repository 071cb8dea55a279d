"""How well the `spans` action space fits a question set: the expert inside the list, and its size.

    .venv/bin/python plugins/envs/search/scripts/spans_coverage.py --question-set lifespans \
        --python --top-k 1
    .venv/bin/python plugins/envs/search/scripts/spans_coverage.py --question-set facts --top-k 1

Per split, plays the expert on every question and counts the questions it answers correctly
with every action inside `valid_actions()`, the first action kind that fell outside the list
for the others, and the list's length per turn (mean and maximum). The numbers the results
scenarios `search-lifespans-spans` and `search-spans` quote come from here.
"""

from __future__ import annotations

import argparse
import collections
import statistics

from agentgym_env_search import SearchConfig, SearchEnv


def coverage(env: SearchEnv, split: str) -> dict[str, object]:
    """The expert's fit to the listed actions on `split`."""
    inside, outside, sizes = 0, collections.Counter(), []
    tasks = env.tasks(split)
    for task in tasks:
        env.reset(task)
        while not env.done:
            action, listed = env.expert_action(), env.valid_actions()
            sizes.append(len(listed))
            if action not in listed:
                outside[action.split("[", 1)[0]] += 1
                break
            env.step(action)
        inside += env.success
    return {
        "split": split,
        "questions": len(tasks),
        "expert inside and correct": inside,
        "first outside, by action": dict(outside),
        "actions per turn, mean": round(statistics.mean(sizes), 1),
        "actions per turn, max": max(sizes),
    }


def main() -> None:
    """Print the coverage of the train and test splits for the options given."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--question-set", default="lifespans")
    parser.add_argument("--python", action="store_true", help="offer python[code]")
    parser.add_argument("--top-k", type=int, default=1)
    parser.add_argument("--max-span-words", type=int, default=4)
    args = parser.parse_args()
    config = SearchConfig(
        question_set=args.question_set,
        python=args.python,
        top_k=args.top_k,
        max_span_words=args.max_span_words,
        action_space="spans",
    )
    env = SearchEnv(config)
    for split in ("train", "test"):
        print(coverage(env, split))
    env.close()


if __name__ == "__main__":
    main()
