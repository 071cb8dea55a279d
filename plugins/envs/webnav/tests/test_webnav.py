"""The webnav environment against real MiniWoB++ pages in headless Chromium."""

from __future__ import annotations

import json
import re

import pytest
from agentgym_env_webnav import DEFAULT_TASKS, WebNavConfig, WebNavEnv
from agentgym_env_webnav.env import map_reward
from agentgym_env_webnav.expert import SOLVERS, NoExpertError

from agentgym_core.api import TEST_SEED_OFFSET
from agentgym_core.testing import check_environment

LINE = re.compile(r'^( {2})*(\[\d+\] [a-z_0-9]+( #\S+)?( ".*")?.*|".*")$')
"""An element line `[ref] tag #id "text" ...` or a text line `"text"`, indented by nesting."""


def task_id(env: WebNavEnv, name: str, seed: int = 0) -> int:
    return seed * len(env.config.tasks) + env.config.tasks.index(name)


def play_expert(env: WebNavEnv, task: int, max_turns: int = 10):
    env.reset(task)
    for _ in range(max_turns):
        result = env.step(env.expert_action())
        if result.done:
            return result
    return result


# -- without a browser ---------------------------------------------------------------


def test_splits_are_deterministic_disjoint_and_cover_every_task():
    env = WebNavEnv(WebNavConfig(train_seeds=30, test_seeds=10))
    train, test = env.tasks("train"), env.tasks("test")
    assert train == env.tasks("train") and len(train) == 30 * len(DEFAULT_TASKS)
    assert len(test) == 10 * len(DEFAULT_TASKS) and not set(train) & set(test)
    assert {env.task_group(t) for t in test} == set(DEFAULT_TASKS)
    assert min(t // len(DEFAULT_TASKS) for t in test) == TEST_SEED_OFFSET
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        env.tasks("dev")
    assert env.browser.driver is None  # listing tasks starts no browser


def test_unknown_task_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown MiniWoB\\+\\+ task 'click-moon'.*click-button"):
        WebNavConfig(tasks=["click-moon"])


def test_reward_maps_raw_minus_one_to_one_onto_zero_to_one():
    assert map_reward(-1.0, "unit") == 0.0
    assert map_reward(1.0, "unit") == 1.0
    assert map_reward(0.5, "unit") == 0.75
    assert map_reward(-0.4, "raw") == -0.4


def test_expert_covers_exactly_the_default_tasks():
    assert set(SOLVERS) == set(DEFAULT_TASKS)


# -- in the browser ------------------------------------------------------------------


def test_protocol_conformance(chromium):
    tasks = ["choose-list", "enter-password", "use-autocomplete"]
    env = WebNavEnv(WebNavConfig(tasks=tasks, train_seeds=3, test_seeds=2))
    check_environment(env, num_tasks=3, max_steps=4)
    assert env.browser.driver is None  # check_environment closes the env


def test_observation_lists_elements_with_ref_tag_text_and_value(env):
    text = env.reset(task_id(env, "login-user"))
    lines = text.splitlines()
    match = re.fullmatch(
        r'Task: Enter the username "(.+)" and the password "(.+)" into .*', lines[0]
    )
    assert match and lines[1] == "Page:"
    assert all(LINE.match(line) for line in lines[2:]), lines
    user_field = next(line for line in lines if "#username" in line)
    assert user_field.strip().endswith('value=""')
    ref = int(re.search(r"\[(\d+)\]", user_field).group(1))
    result = env.step(f"type [{ref}] [{match.group(1)}]")
    assert not result.done and result.reward == 0.0
    assert f'[{ref}] input_text #username value="{match.group(1)}" focused' in result.observation


def test_select_lists_options_and_valid_actions_offer_each(env):
    text = env.reset(task_id(env, "choose-list"))
    line = next(line for line in text.splitlines() if " select " in line)
    options = json.loads(line.split("options=", 1)[1])
    ref = int(re.search(r"\[(\d+)\]", line).group(1))
    assert len(options) >= 2
    offered = [a for a in env.valid_actions() if a.startswith("select ")]
    assert offered == [f"select [{ref}] [{o}]" for o in options]
    result = env.step(f"select [{ref}] [{options[-1]}]")
    assert f"value={json.dumps(options[-1])}" in result.observation


def test_typing_is_listed_only_with_the_utterance_values(env):
    env.reset(task_id(env, "enter-text"))
    word = re.search(r'"(.+)"', env.page.utterance).group(1)
    typing = [a for a in env.valid_actions() if a.startswith("type ")]
    assert len(typing) == 1 and typing[0].endswith(f"[{word}]")
    env.reset(task_id(env, "click-link"))
    assert all(a.startswith("click [") for a in env.valid_actions())


@pytest.mark.parametrize(
    ("action", "says"),
    [
        ("fly to the moon", "Invalid action 'fly to the moon'. Actions: click [ref]"),
        ("click [999]", "There is no element [999] on the page"),
        ("click [4] [now]", "click takes only a ref"),
        ("type [{button}] [hello]", "is a button, not a text field"),
        ("select [{button}] [x]", "not a drop-down list"),
        ("press [{field}] [F13]", "Unknown key 'F13'; keys: Enter, Tab"),
        ("type [{field}]", "type needs an argument"),
    ],
)
def test_invalid_actions_get_a_helpful_observation(env, action, says):
    first = env.reset(task_id(env, "enter-text"))
    refs = {e.tag: e.ref for e in env.page.elements() if e.ref is not None}
    action = action.format(button=refs["button"], field=refs["input_text"])
    result = env.step(action)
    assert says in result.observation
    assert result.reward == 0.0 and not result.done and not result.info["success"]
    assert result.observation.endswith(first)  # the unchanged page follows the explanation


def test_episode_goes_on_after_invalid_actions_and_a_wrong_answer_fails(env):
    task = task_id(env, "click-button", seed=3)
    env.reset(task)
    env.step("click [12345]")
    env.step("hello")
    assert play_expert(env, task).info["success"]  # a fresh episode of the same task
    env.reset(task)
    target = re.search(r'"(.+)"', env.page.utterance).group(1)
    wrong = next(e for e in env.page.elements() if e.tag == "button" and e.text != target)
    result = env.step(f"click [{wrong.ref}]")
    assert result.done and result.reward == 0.0 and result.info["raw_reward"] == -1
    assert not result.info["success"] and "The task is failed." in result.observation
    assert env.step("click [1]").observation == "The episode is over."
    assert env.valid_actions() is None


def test_expert_solves_every_default_task_on_held_out_seeds(env):
    test = env.tasks("test")
    wins = 0
    for task in test[: 2 * len(DEFAULT_TASKS)]:
        result = play_expert(env, task)
        assert result.done, (env.task, result.observation)
        wins += result.info["success"]
        assert result.reward == 1.0 or not result.info["success"]
    assert wins == 2 * len(DEFAULT_TASKS)


@pytest.mark.slow
def test_expert_solves_five_held_out_seeds_of_each_task(env):
    test = env.tasks("test")
    wins = sum(play_expert(env, task).info["success"] for task in test[: 5 * len(DEFAULT_TASKS)])
    assert wins == 5 * len(DEFAULT_TASKS)


def test_expert_recovers_from_a_wrong_state(env):
    env.reset(task_id(env, "click-checkboxes", seed=4))
    boxes = [e for e in env.page.elements() if e.tag == "input_checkbox"]
    for box in boxes:  # check every box: the expert must uncheck the wrong ones
        env.step(f"click [{box.ref}]")
    result = None
    for _ in range(len(boxes) + 2):
        result = env.step(env.expert_action())
        if result.done:
            break
    assert result is not None and result.info["success"]


def test_same_task_same_page_whatever_came_before(env):
    task = task_id(env, "use-autocomplete", seed=7)
    first = env.reset(task)
    env.reset(task_id(env, "click-dialog", seed=2))
    env.step(env.expert_action())
    assert env.reset(task) == first


def test_deferred_page_updates_read_the_same_every_time(env):
    """Autocomplete suggestions come from a timer: the page is read only once it has run."""
    task = task_id(env, "use-autocomplete", seed=1)
    seen = set()
    for _ in range(8):
        env.reset(task)
        prefix = re.search(r'starts with "([^"]+)"', env.page.utterance).group(1)
        field = next(e for e in env.page.elements() if e.tag == "input_text")
        seen.add(env.step(f"type [{field.ref}] [{prefix}]").observation)
    assert len(seen) == 1
    assert re.search(r"\d+ results? (is|are) available", seen.pop())


def test_expert_refuses_tasks_it_does_not_cover(chromium):
    env = WebNavEnv(WebNavConfig(tasks=["click-widget"], train_seeds=2, test_seeds=1))
    try:
        env.reset(0)
        with pytest.raises(NoExpertError, match="no scripted expert for MiniWoB\\+\\+ task"):
            env.expert_action()
    finally:
        env.close()


def test_render_is_a_screenshot_of_the_task_area_that_shows_typing(env):
    """`render()` (frames for `agentgym view`): MiniWoB's 160x210 area as PNG, drawn live."""
    import io

    from PIL import Image

    text = env.reset(task_id(env, "enter-text"))
    before = env.render()
    assert before.startswith(b"\x89PNG\r\n\x1a\n")
    image = Image.open(io.BytesIO(before))
    assert image.size == (160, 210)
    assert len(image.convert("RGB").getcolors(maxcolors=1 << 16)) > 10  # text, field, button
    ref = int(re.search(r"\[(\d+)\] input_text", text).group(1))
    env.step(f"type [{ref}] [hello]")
    assert env.render() != before  # the typed word is on the page now
