"""The sciworld environment against the real ScienceWorld simulator (one JVM per module)."""

from __future__ import annotations

import random

import pytest
from agentgym_env_sciworld import SciWorldConfig, SciWorldEnv
from agentgym_env_sciworld.env import ACTION_HINT, EPISODE_OVER, UNKNOWN_ACTION
from agentgym_env_sciworld.scoring import outcome
from agentgym_env_sciworld.tasks import DEFAULT_TASK_TYPES, decode, encode
from pydantic import ValidationError

from agentgym_core.testing import check_environment

TASKS = ["boil", "find-animal", "chemistry-mix", "power-component"]
"""Three types with short gold paths, and boil, whose gold path (about 90 actions, 10 s to
generate and play here) is left to the slow test."""
BOIL, FIND_ANIMAL = 0, 14
"""Positions of `boil` (1-1) and `find-animal` (4-4) in ScienceWorld's catalogue."""


@pytest.fixture(scope="module")
def env(java):
    """One env (one worker, one JVM) for the whole module: the JVM takes seconds to start."""
    env = SciWorldEnv(SciWorldConfig(tasks=TASKS))
    yield env
    env.close()


def play_gold(env, task_id: int, max_turns: int = 200) -> tuple[float, object]:
    env.reset(task_id)
    total, result = 0.0, None
    for _ in range(max_turns):
        result = env.step(env.expert_action())
        total += result.reward
        if result.done:
            break
    return total, result


# -- pure functions ------------------------------------------------------------------------


def test_rewards_are_clipped_score_changes_that_add_up_to_the_final_score():
    partial = outcome(previous=0, score=37, completed=False, moves=5, max_moves=100)
    assert partial.reward == pytest.approx(0.37) and not partial.done and not partial.success
    win = outcome(previous=37, score=100, completed=True, moves=40, max_moves=100)
    assert win.reward == pytest.approx(0.63) and win.done and win.success and not win.truncated
    # A failing move (score -100) takes back the 0.40 earned: the episode totals 0.
    fail = outcome(previous=40, score=-100, completed=False, moves=9, max_moves=100)
    assert fail.reward == pytest.approx(-0.40) and fail.done and not fail.success
    late = outcome(previous=10, score=10, completed=False, moves=101, max_moves=100)
    assert late.done and late.truncated and late.reward == 0
    won_on_the_last_move = outcome(previous=50, score=100, completed=True, moves=101, max_moves=100)
    assert won_on_the_last_move.success and not won_on_the_last_move.truncated
    assert not outcome(previous=10, score=10, completed=False, moves=10**6, max_moves=None).done


def test_task_ids_encode_type_and_variation():
    assert encode("boil", 21) == 21 and decode(21) == ("boil", 21)
    assert encode("find-animal", 225) == 140_225 and decode(140_225) == ("find-animal", 225)
    with pytest.raises(ValueError, match="not a ScienceWorld task"):
        decode(30 * 10_000)


def test_config_names_what_is_wrong():
    with pytest.raises(ValidationError, match="unknown ScienceWorld task type 'boil-water'.*melt"):
        SciWorldConfig(tasks=["boil-water"])
    assert SciWorldConfig(tasks=["1-1", "4-4"]).tasks == ["boil", "find-animal"]
    with pytest.raises(ValidationError, match="unknown simplification 'fast'.*openDoors"):
        SciWorldConfig(simplifications=["fast"])
    with pytest.raises(ValidationError, match="noElectricalAction.*power-component"):
        SciWorldConfig(tasks=["power-component"], simplifications=["noElectricalAction"])
    assert len(SciWorldConfig().tasks) == len(DEFAULT_TASK_TYPES) == 23


# -- tasks -----------------------------------------------------------------------------------


def test_splits_are_scienceworlds_deterministic_and_disjoint(env):
    train, dev, test = env.tasks("train"), env.tasks("dev"), env.tasks("test")
    assert train == env.tasks("train") and test == env.tasks("test")
    assert not set(train) & set(test) and not set(train) & set(dev) and not set(dev) & set(test)
    # ScienceWorld splits boil's 30 variations 0-13 / 14-20 / 21-29.
    assert [t for t in test if t < 10_000] == list(range(BOIL + 21, BOIL + 30))
    assert [t for t in dev if t < 10_000] == list(range(14, 21))
    # Round robin over the types: any prefix covers all of them.
    assert [env.task_group(t) for t in test[:4]] == TASKS
    assert test[:2] == [BOIL + 21, FIND_ANIMAL * 10_000 + 225]
    assert env.task_group(FIND_ANIMAL * 10_000 + 225) == "find-animal"
    with pytest.raises(ValueError, match="unknown split 'valid'"):
        env.tasks("valid")


def test_max_variations_caps_each_type(env):
    capped = SciWorldEnv(SciWorldConfig(tasks=TASKS, max_variations=2))
    test = capped.tasks("test")  # the splits are cached per process: no second JVM
    assert capped.worker is None
    assert len(test) == 2 * len(TASKS) and test[:5] == [21, 140_225, 170_024, 70_015, 22]


def test_reset_rejects_tasks_outside_the_config(env):
    with pytest.raises(ValueError, match="10021 is melt variation 21, a type not in env.tasks"):
        env.reset(10_021)
    with pytest.raises(ValueError, match="boil has variations 0..29, not 30"):
        env.reset(30)


# -- episodes --------------------------------------------------------------------------------


def test_first_observation_is_task_then_room(env):
    lines = env.reset(21).splitlines()
    assert lines[0].startswith("Task: Your task is to boil lead.")
    assert lines[1].startswith("This room is called the bathroom.")


def test_invalid_action_gets_a_helpful_observation(env):
    env.reset(FIND_ANIMAL * 10_000 + 225)
    for action in ("fly to the moon", "   "):
        result = env.step(action)
        assert result.observation.startswith(UNKNOWN_ACTION) and ACTION_HINT in result.observation
        assert result.reward == 0 and not result.done and not result.info["success"]
    assert env.step("open door to hallway").observation == "The door is now open."


def test_failing_move_ends_the_episode_and_takes_back_partial_credit(env):
    env.reset(FIND_ANIMAL * 10_000 + 225)
    opened = env.step("open door to hallway")  # a subgoal: in a room with an open door
    assert opened.reward == pytest.approx(0.08) and opened.info["score"] == 8
    failed = env.step("focus on air")  # air is not an animal: ScienceWorld scores -100
    assert failed.done and not failed.info["success"] and failed.info["score"] == -100
    assert opened.reward + failed.reward == pytest.approx(0.0)
    assert env.step("look around") == env.step("look around")
    assert env.step("look around").observation == EPISODE_OVER


@pytest.mark.parametrize("task_type", TASKS[1:])
def test_gold_path_wins_a_test_variation(env, task_type):
    task = next(t for t in env.tasks("test") if env.task_group(t) == task_type)
    total, last = play_gold(env, task)
    assert last.done and last.info["success"] and last.info["score"] == 100
    assert total == pytest.approx(1.0)
    assert env.expert_action() == "look around"  # after the end


def test_valid_actions_are_none_unless_listed(env):
    env.reset(FIND_ANIMAL * 10_000 + 225)
    assert env.valid_actions() is None
    env.config = env.config.model_copy(update={"list_valid_actions": True})
    try:
        actions = env.valid_actions()
        assert "look around" in actions and "open door" in actions
        assert "open door to hallway" not in actions  # one referent per object only
        assert len(actions) > 300  # why it is off by default
        for action in random.Random(0).sample(actions, 10):
            env.reset(FIND_ANIMAL * 10_000 + 225)
            assert env.step(action).observation.strip(), action
    finally:
        env.config = env.config.model_copy(update={"list_valid_actions": False})


def test_protocol_conformance(env):
    """Last in the module: check_environment closes the env it checks."""
    with pytest.warns(UserWarning, match="no episode ended"):
        check_environment(env, num_tasks=3, max_steps=6)
    assert env.worker is None


@pytest.mark.slow
def test_gold_path_wins_a_sample_of_every_default_type(java):
    """A random test variation of each of the 23 default types (about half a minute)."""
    env = SciWorldEnv(SciWorldConfig())
    try:
        rng = random.Random(0)
        by_type: dict[str, list[int]] = {}
        for task in env.tasks("test"):
            by_type.setdefault(env.task_group(task), []).append(task)
        sample = [t for tasks in by_type.values() for t in rng.sample(tasks, 1)]
        failures = [t for t in sample if not play_gold(env, t)[1].info["success"]]
        assert not failures, [decode(t) for t in failures]
    finally:
        env.close()
