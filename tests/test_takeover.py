"""Expert takeovers (DAgger-style data): where a played episode is cut, and its replay."""

from __future__ import annotations

import functools
import random

import pytest

from agentgym_core.data.expert import (
    ReplayDiverged,
    RollIn,
    cut_roll_in,
    expert_episode,
    expert_items,
    expert_items_in_processes,
)
from agentgym_core.types import Termination, Trajectory, Turn

pytest.importorskip("agentgym_env_babyai")


def _played(task_id: int, turns: int, termination: Termination) -> Trajectory:
    trajectory = Trajectory(task_id=task_id, group=0, termination=termination)
    trajectory.turns = [Turn(f"a{i}", f"o{i}", 0.0) for i in range(turns)]
    return trajectory


def test_a_cut_falls_on_a_turn_after_the_first_and_before_an_ending_one():
    # 3 turns that ended the episode: the expert needs a state, so cuts 1 or 2 (never 3);
    # 3 turns stopped by the horizon: cuts 1, 2 or 3
    ended = {len(cut_roll_in(_played(task, 3, Termination.DONE), 0).actions) for task in range(60)}
    horizon = {
        len(cut_roll_in(_played(task, 3, Termination.HORIZON), 0).actions) for task in range(60)
    }
    assert ended == {1, 2}
    assert horizon == {1, 2, 3}
    roll_in = cut_roll_in(_played(5, 3, Termination.HORIZON), 0)
    cut = len(roll_in.actions)
    assert roll_in == RollIn(tuple(f"a{i}" for i in range(cut)), tuple(f"o{i}" for i in range(cut)))


def test_a_cut_is_the_same_for_the_same_seed_and_task_and_nothing_cuts_an_unusable_episode():
    cuts = [len(cut_roll_in(_played(7, 20, Termination.HORIZON), seed).actions) for seed in (0, 0)]
    assert cuts[0] == cuts[1]
    by_seed = {len(cut_roll_in(_played(7, 20, Termination.HORIZON), s).actions) for s in range(20)}
    assert len(by_seed) > 5  # the seed moves it
    assert cut_roll_in(_played(1, 1, Termination.DONE), 0) is None  # won in its only turn
    assert cut_roll_in(_played(1, 0, Termination.HORIZON), 0) is None
    assert cut_roll_in(_played(1, 5, Termination.ENV_ERROR), 0) is None


def _agentgym_env():
    from agentgym_env_babyai import BabyAIConfig
    from agentgym_env_babyai.plugin import make_babyai

    config = BabyAIConfig(levels="agentgym", list_actions=False, instruction="Reach the goal.")
    return config, make_babyai(config)


def _random_roll_in(env, task_id: int, turns: int, seed: int) -> RollIn:
    """`turns` random available actions from the task's start, and what the env answered."""
    rng = random.Random(seed)
    env.reset(task_id)
    actions, observations = [], []
    for _ in range(turns):
        action = rng.choice([a for a in env.valid_actions() if "check" not in a])
        result = env.step(action)
        if result.done:
            break
        actions.append(action)
        observations.append(result.observation)
    return RollIn(tuple(actions), tuple(observations))


def test_the_expert_takes_over_after_the_replayed_turns_which_stay_context():
    _, env = _agentgym_env()
    try:
        tasks = env.tasks("train")[40:52]  # seed 1 of every level that has train tasks
        played = [_random_roll_in(env, task, 3, seed=task) for task in tasks]
        run = expert_items(env, "babyai", tasks, max_turns=20, roll_ins=played)
    finally:
        env.close()
    assert run.diverged == 0 and run.successes >= 6, run
    for item in run.items:
        task = int(item["item_id"].rsplit("_", 1)[1])
        roll_in = played[tasks.index(task)]
        turns = item["conversations"][3:]  # after instruction, "Ok." and the first observation
        replayed = turns[: 2 * len(roll_in.actions)]
        assert item["roll_in_turns"] == len(roll_in.actions)
        assert [t["value"] for t in replayed[0::2]] == list(roll_in.actions)
        assert [t["value"] for t in replayed[1::2]] == list(roll_in.observations)
        assert all(t["loss"] is False for t in replayed[0::2])
        expert_turns = [t for t in turns[2 * len(roll_in.actions) :] if t["from"] == "gpt"]
        assert expert_turns and all(t["loss"] is True for t in expert_turns)


def test_a_roll_in_the_env_answers_otherwise_is_counted_and_gives_no_item():
    _, env = _agentgym_env()
    try:
        task = env.tasks("train")[40]
        roll_in = _random_roll_in(env, task, 2, seed=0)
        wrong = RollIn(roll_in.actions, (roll_in.observations[0], "not what the env said"))
        with pytest.raises(ReplayDiverged, match=f"task {task}"):
            expert_episode(env, task, 20, roll_in=wrong)
        run = expert_items(env, "babyai", [task, task], max_turns=20, roll_ins=[wrong, roll_in])
    finally:
        env.close()
    assert run.diverged == 1
    assert run.env_steps > 0  # the expert played the faithful roll-in only
    assert [item["roll_in_turns"] for item in run.items] == [len(roll_in.actions)] * len(run.items)


def test_takeovers_shared_among_processes_are_those_of_one():
    from agentgym_env_babyai.plugin import make_babyai

    config, env = _agentgym_env()
    try:
        tasks = env.tasks("train")[40:47]
        played = [_random_roll_in(env, task, 2, seed=task) for task in tasks]
        alone = expert_items(env, "babyai", tasks, max_turns=20, roll_ins=played)
    finally:
        env.close()
    shared = expert_items_in_processes(
        functools.partial(make_babyai, config),
        "babyai",
        tasks,
        workers=2,
        max_turns=20,
        roll_ins=played,
    )
    assert alone.items and shared == alone
