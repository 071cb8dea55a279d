"""`levels: agentgym`: AgentGym's BabyAI server, in-process, against what that server answers.

`data/agentgym_transcripts.json.gz` holds episodes recorded from AgentGym's own
server code (agentenv-babyai) on minigrid 2.3.1, and `data/agentgym_layouts.json.gz`
the layouts that minigrid 2.3.1 draws for AgentGym's (level, seed) pairs; both
were made by the scripts in `scripts/` and are replayed here on today's minigrid.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from agentgym_env_babyai import AgentGymBabyAIEnv, BabyAIConfig
from agentgym_env_babyai.agentgym import levels
from agentgym_env_babyai.plugin import make_babyai
from pydantic import ValidationError

from agentgym_core.testing import check_environment

DATA = Path(__file__).parent / "data"


def _load(name: str) -> dict:
    with gzip.open(DATA / name, "rt") as file:
        return json.load(file)


@pytest.fixture(scope="module")
def env():
    env = AgentGymBabyAIEnv(BabyAIConfig(levels="agentgym"))
    yield env
    env.close()


def test_data_idx_0_is_go_to_the_red_ball_and_one_go_to_ends_it_with_0_8875(env):
    first = env.reset(0)
    assert first.startswith("Your goal: go to the red ball\nIn front of you in this room")
    assert '"go to red ball 1"' in first.splitlines()[-1]
    result = env.step("go to red ball 1")
    assert result.reward == pytest.approx(0.8875)
    assert result.done and result.info["success"]
    assert "\n The task is completed.\nAvailable actions: [" in result.observation


def test_data_idx_is_level_mod_40_and_seed_div_40(env):
    assert env.task_group(0) == "01-GoToRedBallGrey"
    assert env.task_group(40) == "01-GoToRedBallGrey" and levels.level_seed(40) == 1
    assert env.task_group(39) == "40-BossLevelNoUnlock"
    env.reset(40)
    seed_1 = env.unwrapped.grid.encode().tobytes()
    env.reset(0)
    assert env.unwrapped.grid.encode().tobytes() != seed_1


def test_test_split_is_agentgyms_90_ids_and_train_is_disjoint(env):
    test, train = env.tasks("test"), env.tasks("train")
    assert len(test) == 90 and test[:3] == [1804, 1840, 1844]
    per_level = Counter(levels.level_number(i) for i in test)
    assert len(per_level) == 18 and set(per_level.values()) == {5}
    assert not set(test) & set(train)
    assert len(train) == 40 * 1000 - 90
    heldout = env.tasks("heldout")
    assert not set(heldout) & (set(train) | set(test)) and len(heldout) == 40 * 100
    with pytest.raises(ValueError, match="splits: train, test, heldout"):
        env.tasks("dev")


def test_agentgym_levels_keep_data_idx_and_filter_every_split():
    config = BabyAIConfig(levels="agentgym", agentgym_levels=[1, "GoToRedBall"], train_seeds=10)
    env = make_babyai(config)
    assert isinstance(env, AgentGymBabyAIEnv)
    assert {levels.level_number(i) for i in env.tasks("train")} == {1, 2}
    assert env.tasks("test") == [i for i in levels.TEST_IDS if i % 40 in (0, 1)]
    assert env.tasks("train")[:4] == [0, 1, 40, 41]


def test_bad_agentgym_options_name_what_is_wrong():
    with pytest.raises(ValidationError, match="agentgym level 41 is not in 1..40"):
        BabyAIConfig(levels="agentgym", agentgym_levels=[41])
    with pytest.raises(ValidationError, match="AgentGym's levels: GoToRedBallGrey, GoToRedBall"):
        BabyAIConfig(levels="agentgym", agentgym_levels=["GoToObj"])
    with pytest.raises(ValidationError, match="agentgym_levels needs levels: agentgym"):
        BabyAIConfig(levels=["GoToObj"], agentgym_levels=[1])
    # an option only AgentGym's levels read is an error elsewhere, not silently ignored
    with pytest.raises(ValidationError, match="expert_search needs levels: agentgym"):
        BabyAIConfig(levels=["GoToObj"], expert_search=1)
    # a resolved config (every default written out) loads again
    resolved = BabyAIConfig(levels="agentgym", expert_search=1).model_dump()
    assert BabyAIConfig(**resolved).repeat_goal and BabyAIConfig(**resolved).expert_search == 1


def test_layouts_are_those_minigrid_2_3_1_draws():
    """GoToObjS6 (room size 4 in 2.3.1) and Synth* (a kept locked room) differ on plain 3.x."""
    games: dict = {}
    for key, (mission, pos, direction, grid_hash) in _load("agentgym_layouts.json.gz").items():
        data_idx = int(key)
        name = levels.level_name(data_idx)
        game = games.setdefault(name, levels.make_level(name))
        levels.reset_level(game, levels.level_seed(data_idx))
        inner = game.unwrapped
        got = hashlib.md5(inner.grid.encode().tobytes()).hexdigest()[:12]
        assert (inner.mission, list(inner.agent_pos), inner.agent_dir, got) == (
            mission,
            pos,
            direction,
            grid_hash,
        ), f"data_idx {data_idx} ({name})"


def test_episodes_replay_as_agentgyms_server_answered_them(env):
    """Observations, rewards, scores and ends, also after unavailable and odd actions."""
    transcripts = _load("agentgym_transcripts.json.gz")
    assert {levels.level_number(int(i)) for i in transcripts} == set(range(1, 41))
    for key, (first, *steps) in transcripts.items():
        assert env.reset(int(key)) == first[0], f"reset of data_idx {key}"
        score = 0.0
        for action, observation, reward, want_score, done in steps:
            result = env.step(action)
            score += result.reward
            where = f"data_idx {key}, action {action!r}"
            assert result.observation == observation, where
            assert (result.reward, round(score, 6), result.done) == pytest.approx(
                (reward, want_score, done)
            ), where


def test_protocol_conformance(env):
    check_environment(env, num_tasks=5)


def _free_port() -> int:
    with socket.socket() as probe:  # a free port, released for the server to take
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def agentgym_server():
    """`agentgym serve-env babyai --env-option levels=agentgym`, a real process on loopback."""
    port = _free_port()
    command = [sys.executable, "-m", "agentgym_core.cli", "serve-env", "babyai", "--port"]
    options = ["--env-option", "levels=agentgym", "--log-level", "warning"]
    process = subprocess.Popen(
        [*command, str(port), *options], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                httpx.get(f"{url}/info", timeout=1)
                break
            except httpx.TransportError:
                assert process.poll() is None, process.stdout.read()
                assert time.monotonic() < deadline, "serve-env did not start"
                time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(20)


def test_serve_env_answers_as_agentgyms_server(agentgym_server):
    """The same replies over HTTP as AgentGym's server gave: observation, reward, score, done."""
    transcripts = _load("agentgym_transcripts.json.gz")
    chosen = [str(i) for i in (0, 3, 7, 21, 29, 36)] + [str(i) for i in levels.TEST_IDS[:6]]
    with httpx.Client(base_url=agentgym_server, timeout=30) as http:
        env_id = http.post("/create", json={}).json()["id"]
        for key in chosen:
            first, *steps = transcripts[key]
            reply = http.post("/reset", json={"id": env_id, "data_idx": int(key)}).json()
            assert reply["observation"] == first[0]
            for action, observation, reward, score, done in steps:
                reply = http.post("/step", json={"id": env_id, "action": action}).json()
                got = (reply["observation"], reply["reward"], reply["score"], reply["done"])
                assert got == (observation, pytest.approx(reward), pytest.approx(score), done)
        http.post("/close", json={"id": env_id})


def test_expert_reaches_easy_goals_in_a_few_macro_actions(env):
    """The bot's course told in AgentGym's macros: `go to ...` in one turn, not one per step."""
    tasks = [i for i in env.tasks("train")[:200] if levels.level_number(i) in (1, 2, 5, 10, 20)]
    turns = []
    for task in tasks[:20]:
        env.reset(task)
        turns.append(0)
        while turns[-1] < 10:
            turns[-1] += 1
            result = env.step(env.expert_action())
            if result.done:
                break
        assert result.info["success"], f"data_idx {task} ({env.task_group(task)})"
    assert sum(turns) / len(turns) <= 2.5, turns


@pytest.mark.timeout(60)
def test_expert_returns_where_the_bot_would_loop_forever(env):
    """data_idx 68: a locked door and no way to its key; the bot stacked subgoals without end.

    Before the bound on its stack, the first `expert_action` never returned (25 minutes,
    11 GB); now every turn returns an action and the episode ends at its turn limit.
    """
    env.reset(68)
    actions = [env.expert_action()]
    for _ in range(19):
        result = env.step(actions[-1])
        if result.done:
            break
        actions.append(env.expert_action())
    assert len(actions) >= 2 and all(isinstance(a, str) and a for a in actions)


def test_bot_stack_past_its_bound_fails_as_the_bot_does():
    """Pushing past STACK_LIMIT raises the AssertionError the expert treats as 'lost its way'."""
    from agentgym_env_babyai.bot import STACK_LIMIT, SubgoalStack

    stack = SubgoalStack()
    for item in range(STACK_LIMIT):
        stack.append(item)
    with pytest.raises(AssertionError, match="more than"):
        stack.append("one too many")
    assert len(stack) == STACK_LIMIT


def _expert_episode(task: int, search: int) -> tuple[bool, list[str]]:
    env = AgentGymBabyAIEnv(BabyAIConfig(levels="agentgym", expert_search=search))
    try:
        env.reset(task)
        actions = []
        for _ in range(20):
            actions.append(env.expert_action())
            if env.step(actions[-1]).done:
                return True, actions
        return False, actions
    finally:
        env.close()


def test_expert_search_wins_where_no_macro_follows_the_bot():
    """data_idx 3887 (GoToSeqS5R2, a test task): facing the grey door it came through, the
    bot's next step is to toggle it, which no macro offers. The bot alone then asks for the
    action list until the turn limit; looking two macros ahead for a win finishes the task."""
    alone, actions = _expert_episode(3887, search=0)
    assert not alone and actions[-3:] == ["check available actions"] * 3
    searched, actions = _expert_episode(3887, search=2)
    assert searched and len(actions) <= 6, actions


def test_a_win_one_macro_away_is_found_and_none_past_the_depth(env):
    from agentgym_env_babyai.agentgym.expert import first_of_win

    task = next(i for i in env.tasks("train") if levels.level_number(i) == 2)  # GoToRedBall
    env.reset(task)
    win = first_of_win(env.game, env.view, env.image, depth=1)
    assert win is not None and win.endswith("red ball 1")  # go to it, or pick it up
    assert env.step(win).done
    env.reset(3887)  # a sequence of two goals, the second out of sight: no win in one macro
    assert first_of_win(env.game, env.view, env.image, depth=1) is None


def test_a_copy_to_play_ahead_on_shares_the_walls_and_leaves_the_game_as_it_was(env):
    """The search plays macros on copies; sharing the walls (most grid objects) makes them cheap.

    What a step can change (the agent, what it carries, objects, doors) must stay apart.
    """
    from agentgym_env_babyai.agentgym.expert import _run, copy_game, state_key

    task = next(i for i in env.tasks("train") if levels.level_number(i) == 17)  # Pickup
    env.reset(task)
    before = state_key(env.game)
    picked = []
    for action, plan in env.view.actions.items():
        if action.startswith("pickup"):
            after = _run(env.game, plan, env.image)[0].unwrapped
            picked.append(after.carrying is not None)
    assert any(picked) and env.game.unwrapped.carrying is None
    assert state_key(env.game) == before
    original, copied = env.game.unwrapped.grid.grid, copy_game(env.game).unwrapped.grid.grid
    pairs = [(a, b) for a, b in zip(original, copied, strict=True) if a is not None]
    assert all((a is b) == (a.type == "wall") for a, b in pairs)
    assert any(a.type != "wall" for a, _ in pairs)


def test_the_expert_plans_again_after_a_bot_whose_first_plan_failed(env, monkeypatch):
    """A fresh bot that loses its way at once is not kept: the next call plans anew.

    Taking over a student's episode reached such states; the kept half-made bot then
    failed on minigrid's missing `prev_carrying` and stopped the whole run.
    """
    from agentgym_env_babyai.agentgym import expert as expert_module

    made = []
    real_new_bot = expert_module.new_bot

    def first_one_lost(game):
        bot = real_new_bot(game)
        if not made:  # the first bot's first plan fails, as a lost bot's does
            bot.replan = lambda action_taken=None: (_ for _ in ()).throw(AssertionError("lost"))
        made.append(bot)
        return bot

    monkeypatch.setattr(expert_module, "new_bot", first_one_lost)
    env.reset(env.tasks("train")[0])
    assert env.expert_action() == "check available actions"
    action = env.expert_action()
    assert len(made) == 2 and action in env.valid_actions() and action != "check available actions"


def test_agentgym_prompt_talks_as_agentgyms_client():
    """Its instruction asks for Thought/Action; the action is read after `Action:` and cleaned."""
    from agentgym_env_babyai.agentgym.env import CLIENT_INSTRUCTION, client_action

    assert client_action("Thought:\nThe ball is ahead.\n\nAction:\ngo to red ball 1\n") == (
        "go to red ball 1"
    )
    assert client_action("Action: turn left.\nAction:  go to  red ball 1!") == "go to red ball 1"
    assert client_action("go to red ball 1") == "go to red ball 1"  # a bare action, taken whole
    prompted = AgentGymBabyAIEnv(BabyAIConfig(levels="agentgym", agentgym_prompt=True))
    plain = AgentGymBabyAIEnv(BabyAIConfig(levels="agentgym"))
    assert prompted.instruction() == CLIENT_INSTRUCTION != plain.instruction()
    for env in (prompted, plain):
        env.reset(0)  # data_idx 0: go to the red ball, one `go to` ends it
    reply = "Thought:\nI see it.\n\nAction:\ngo to red ball 1"
    assert prompted.step(reply).done
    assert not plain.step(reply).done  # without the option the whole reply is the action
