"""The BabyAI environment against real minigrid levels."""

from __future__ import annotations

import json
import random

import pytest
from agentgym_env_babyai import BabyAIConfig, BabyAIEnv
from agentgym_env_babyai.env import NOT_RECOGNIZED

from agentgym_core.testing import check_environment

LEVELS = ["GoToObj", "GoToLocal", "PickupDist", "OpenDoor", "PutNextLocalS5N3"]


@pytest.fixture
def env():
    env = BabyAIEnv(BabyAIConfig(levels=LEVELS, train_seeds=50, test_seeds=20))
    yield env
    env.close()


def test_protocol_conformance(env):
    check_environment(env, num_tasks=5)


def test_splits_are_deterministic_disjoint_and_cover_every_level(env):
    train, test = env.tasks("train"), env.tasks("test")
    assert train == env.tasks("train") and len(train) == 50 * len(LEVELS)
    assert not set(train) & set(test)
    assert {env.task_group(t) for t in test} == set(LEVELS)
    with pytest.raises(ValueError, match="unknown split"):
        env.tasks("dev")


def test_first_observation_has_goal_view_and_actions(env):
    text = env.reset(env.tasks("test")[1])
    lines = text.splitlines()
    assert lines[0].startswith("Your goal: go to")
    assert any(line.startswith("You see:") for line in lines)
    assert lines[-1].startswith("Available actions: ")
    assert json.loads(lines[-1][len("Available actions: ") :]) == env.valid_actions()


def test_every_valid_action_is_accepted(env):
    rng = random.Random(0)
    for task in env.tasks("train")[:40]:
        env.reset(task)
        for _ in range(4):
            actions = env.valid_actions()
            result = env.step(rng.choice(actions))
            assert NOT_RECOGNIZED not in result.observation
            if result.done:
                break


def test_a_turn_works_out_the_agents_view_once(env, monkeypatch):
    """Observation, valid actions and the step's check share one view; no image is made.

    The view (minigrid's `gen_obs_grid`), asked for three times a turn, and the encoded image
    its `gen_obs` makes after every primitive step were the env's largest cost in a profile
    of the demo's rollouts; the text uses the view only.
    """
    from minigrid.minigrid_env import MiniGridEnv

    views, grid = [], MiniGridEnv.gen_obs_grid
    monkeypatch.setattr(
        MiniGridEnv, "gen_obs_grid", lambda self, *a, **k: views.append(1) or grid(self, *a, **k)
    )
    longest = 0
    for task in env.tasks("train")[:10]:
        env.reset(task)
        assert len(views) == 1
        for _ in range(6):
            if env.done:
                break
            views.clear()
            actions = env.valid_actions()
            go = [a for a in actions if a.startswith("go to")]
            result = env.step(go[-1] if go else "move forward")
            # the new state's view, for its observation (none once the task is completed)
            assert len(views) == (0 if result.info["success"] else 1)
            longest = max(longest, result.info["primitive_steps"])
        views.clear()
    assert longest >= 3  # some turns ran several primitive steps, and made no view for each


def test_invalid_action_gets_a_helpful_observation(env):
    env.reset(env.tasks("train")[0])
    result = env.step("fly to the moon")
    assert NOT_RECOGNIZED in result.observation and result.reward == 0 and not result.done
    result = env.step("go to purple dragon 7")
    assert NOT_RECOGNIZED in result.observation


@pytest.mark.parametrize("level", LEVELS)
def test_expert_solves_test_tasks(level):
    env = BabyAIEnv(BabyAIConfig(levels=[level], test_seeds=15))
    wins = 0
    for task in env.tasks("test"):
        env.reset(task)
        for _ in range(64):
            result = env.step(env.expert_action())
            if result.done:
                break
        wins += env.success
        assert not env.success or 0 < result.reward <= 1
    assert wins / 15 >= 0.95


def test_putnext_is_solved_by_pick_up_go_to_drop():
    """PutNext needs at least three actions: pick up A, go to B (turning until B is seen), drop."""
    env = BabyAIEnv(BabyAIConfig(levels=["PutNextLocalS5N3"], list_actions=False))
    tried = solved = 0
    for task in env.tasks("test")[:20]:
        env.reset(task)
        mission = env.unwrapped.mission  # "put the <a> next to the <b>"
        a, b = (part.split(" ", 1)[-1] for part in mission[4:].split(" next to "))
        names = {name.rsplit(" ", 1)[0]: name for name in env.things}
        if f"pick up {names[a]}" not in env.valid_actions():
            continue
        tried += 1
        assert not env.step(f"pick up {names[a]}").done
        for _ in range(3):
            if f"go to {names[b]}" in env.valid_actions():
                break
            env.step("turn left")
        assert not env.step(f"go to {names[b]}").done
        result = env.step("drop")
        solved += result.done and env.success
    assert tried >= 8 and solved == tried


def test_random_policy_rarely_solves_putnext():
    env = BabyAIEnv(BabyAIConfig(levels=["PutNextLocalS5N3"]))
    rng = random.Random(0)
    wins = 0
    for task in env.tasks("test")[:60]:
        env.reset(task)
        for _ in range(6):
            if env.step(rng.choice(env.valid_actions())).done:
                break
        wins += env.success
    assert wins / 60 < 0.2


def test_unknown_level_lists_valid_ones():
    with pytest.raises(ValueError, match="unknown level 'GoToMoon'.*GoToLocal"):
        BabyAIConfig(levels=["GoToMoon"])


def test_level_generator_is_silent(capsys):
    env = BabyAIEnv(BabyAIConfig(levels=["GoToLocal"]))
    for task in env.tasks("train")[:30]:
        env.reset(task)
    assert capsys.readouterr().out == ""


def test_expert_starts_a_fresh_bot_after_the_bot_loses_its_way(env):
    """A failing bot (an AssertionError, as the stack bound raises) costs one turn, not a run."""

    class LostBot:
        def replan(self, action=None):
            raise AssertionError("lost")

    env.reset(env.tasks("test")[0])
    env.expert_action()
    env._bot = LostBot()
    assert env.expert_action() == "turn left" and env._bot is None
    assert env.expert_action() in env.valid_actions() and env._bot is not None
