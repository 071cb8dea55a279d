"""Relabelled copies of demonstrations: permutations, seeds, and copies that replay."""

from __future__ import annotations

import pytest

from agentgym_core.data.agenttraj import parse_items
from agentgym_core.data.expert import expert_items
from agentgym_core.data.relabel import (
    apply_permutation,
    check_word_classes,
    permutation,
    relabelled_items,
)
from agentgym_core.types import AgentTrajItem, Message


def _item(*observations_and_actions: str) -> AgentTrajItem:
    turns = [Message("human", "Answer with one action; red means stop."), Message("gpt", "Ok.")]
    for index, text in enumerate(observations_and_actions):
        turns.append(Message("gpt" if index % 2 else "human", text, True if index % 2 else None))
    return AgentTrajItem("toy_3", turns, {"reward": 1.0})


def test_a_permutation_swaps_whole_words_at_once():
    swap = {"red": "blue", "blue": "red"}
    assert apply_permutation("red ball, blue key; bred, redo, red.", swap) == (
        "blue ball, red key; bred, redo, blue."
    )
    assert apply_permutation("red", {}) == "red"


def test_word_classes_are_checked():
    assert check_word_classes([["a", "b"], ("c", "d")]) == [("a", "b"), ("c", "d")]
    with pytest.raises(ValueError, match="2\\+ distinct"):
        check_word_classes([["a"]])
    with pytest.raises(ValueError, match="2\\+ distinct"):
        check_word_classes([["a", "a"]])
    with pytest.raises(ValueError, match="more than one class: \\['b'\\]"):
        check_word_classes([["a", "b"], ["b", "c"]])
    with pytest.raises(ValueError, match="single words"):
        check_word_classes([["red ball", "box"]])


def test_copies_are_seeded_consistent_and_keep_the_instruction():
    colours = ["red", "green", "blue", "purple", "yellow", "grey"]
    item = _item("Your goal: go to the red ball\nA red ball, a blue key.", "go to red ball 1")
    copies = relabelled_items([item], [colours], 6, seed=3)
    assert relabelled_items([item], [colours], 6, seed=3) == copies  # a resumed stage's data
    assert relabelled_items([item], [colours], 6, seed=4) != copies
    assert len(copies) == 6 and all(c.item_id == "toy_3" for c in copies)
    for copy in copies:
        moved = copy.extra["relabelled"]
        assert copy.extra["reward"] == 1.0
        assert sorted(moved) == sorted(moved.values())  # a permutation of the words it moves
        assert copy.conversations[:2] == item.conversations[:2]  # as the agent sees it
        goal = moved.get("red", "red")
        assert copy.conversations[2].value.startswith(f"Your goal: go to the {goal} ball\nA {goal}")
        assert copy.conversations[3] == Message("gpt", f"go to {goal} ball 1", True)
        back = {new: old for old, new in moved.items()}
        assert [apply_permutation(t.value, back) for t in copy.conversations[2:]] == [
            t.value for t in item.conversations[2:]
        ]
    assert len({c.conversations[3].value for c in copies}) > 1


def test_permutations_cover_the_class():
    import random

    rng = random.Random(0)
    seen = {permutation([("a", "b", "c")], rng)["a"] for _ in range(60)}
    assert seen == {"a", "b", "c"}


# -- BabyAI: a relabelled expert episode is an episode of the relabelled world ----------------


def _recolour(env, mapping: dict[str, str]) -> str:
    """Repaint every object (not the walls) and the mission of the env's current task."""
    from agentgym_env_babyai.agentgym.env import action_list
    from agentgym_env_babyai.agentgym.view import observe

    game = env.unwrapped
    for obj in [*game.grid.grid, game.carrying]:
        if obj is not None and obj.type != "wall":
            obj.color = mapping.get(obj.color, obj.color)

    def repaint(instr):
        for name in ("desc", "desc_move", "desc_fixed"):
            desc = getattr(instr, name, None)
            if desc is not None and desc.color is not None:
                desc.color = mapping.get(desc.color, desc.color)
        for name in ("instr_a", "instr_b"):
            if getattr(instr, name, None) is not None:
                repaint(getattr(instr, name))

    repaint(game.instrs)
    game.instrs.reset_verifier(game)
    game.mission = game.instrs.surface(game)
    env.goal = game.mission.replace("then", "and").replace("after you", "and")
    obs = game.gen_obs()
    env.image = obs["image"]
    env.view = observe(game, obs["image"], obs["direction"])
    return f"Your goal: {env.goal}\n{env.view.description}{action_list(env.valid_actions())}"


def test_relabelled_babyai_expert_episodes_replay_in_the_repainted_world():
    """Each copy, played in its task's world with the colours repainted, wins turn for turn."""
    pytest.importorskip("agentgym_env_babyai")
    from agentgym_env_babyai import BabyAIConfig
    from agentgym_env_babyai.plugin import make_babyai

    env = make_babyai(BabyAIConfig(levels="agentgym", list_actions=False, instruction="Go."))
    try:
        tasks = env.tasks("train")[:40]  # seed 0 of every level with train tasks
        items = parse_items(expert_items(env, "babyai", tasks, max_turns=20).items)
        copies = relabelled_items(items, env.interchangeable_words(), 2, seed=0)
        assert len(items) >= 20 and len(copies) == 2 * len(items)
        replayed = 0
        for copy in copies:
            env.reset(copy.task_id)
            turns = copy.conversations[2:]
            assert _recolour(env, copy.extra["relabelled"]) == turns[0].value, copy.item_id
            for action, answer in zip(turns[1::2], [*turns[2::2], None], strict=True):
                result = env.step(action.value)
                if answer is not None:
                    assert result.observation == answer.value, (copy.item_id, action.value)
            assert result.done and result.reward > 0.5, copy.item_id
            replayed += 1
    finally:
        env.close()
    assert replayed == len(copies)
    assert sum(bool(c.extra["relabelled"]) for c in copies) > len(copies) * 0.9
