"""The `webnav` environment: MiniWoB++ tasks in a real headless Chromium, as text."""

from __future__ import annotations

import json

from agentgym_core.api import StepResult, seeded_task, seeded_task_ids
from agentgym_env_webnav import expert
from agentgym_env_webnav.actions import (
    ActionError,
    enumerable_actions,
    parse_action,
    typing_candidates,
)
from agentgym_env_webnav.browser import Browser
from agentgym_env_webnav.config import WebNavConfig
from agentgym_env_webnav.page import Page, parse_page

OVER = "The episode is over."
INSTRUCTION = """You are a web agent. Each observation shows a task and the elements of a web page,
one per line: [ref] tag #id "text", then the value of a field or list, and "focused" on the
element that has the focus. Answer with one action per turn:
- click [ref]: click the element (a button, link, checkbox, tab, text field...)
- type [ref] [text]: clear the text field and type the text into it
- select [ref] [option]: choose an option of a drop-down list
- press [ref] [key]: press a key on the element (Enter, Tab, Escape, ArrowDown, ...)"""


def map_reward(raw: float, mode: str) -> float:
    """MiniWoB's raw reward in [-1, 1] as the episode reward (see `WebNavConfig.reward`)."""
    return raw if mode == "raw" else (raw + 1.0) / 2.0


class WebNavEnv:
    """One MiniWoB++ episode at a time; tasks are (task name, seed) pairs encoded as integers.

    The browser starts at the first reset and serves every later episode.
    """

    def __init__(self, config: WebNavConfig) -> None:
        self.config = config
        self.browser = Browser(config)
        self.page: Page | None = None
        self.task = ""
        self.typing: list[str] = []
        self.done = True
        self.success = False

    # -- tasks -------------------------------------------------------------------

    def tasks(self, split: str) -> list[int]:
        """Ids `seed * n_tasks + task_index`; test seeds start at 1,000,000."""
        return seeded_task_ids(
            split,
            kinds=len(self.config.tasks),
            train_seeds=self.config.train_seeds,
            test_seeds=self.config.test_seeds,
        )

    def task_group(self, task_id: int) -> str:
        """The MiniWoB++ task name of a task id."""
        return self.config.tasks[seeded_task(task_id, kinds=len(self.config.tasks)).kind]

    def instruction(self) -> str:
        """Page format and action syntax, shown once at the start of each conversation."""
        return self.config.instruction or INSTRUCTION

    # -- episode -------------------------------------------------------------------

    def reset(self, task_id: int) -> str:
        """Load the task's page afresh and start the episode with the task id's seed."""
        if isinstance(task_id, bool) or not isinstance(task_id, int) or task_id < 0:
            raise ValueError(f"task ids are non-negative integers, got {task_id!r}")
        kind, seed, mode = seeded_task(task_id, kinds=len(self.config.tasks))
        self.task = self.config.tasks[kind]
        self.page = parse_page(self.browser.start_episode(self.task, seed, mode))
        self.typing = typing_candidates(self.task, self.page.utterance)
        self.done, self.success = False, False
        return self._observe()

    def _observe(self, note: str = "") -> str:
        assert self.page is not None
        parts = [note] if note else []
        parts.append(self.page.render())
        if self.config.list_actions:
            actions = enumerable_actions(self.page, self.typing)
            parts.append(f"Available actions: {json.dumps(actions, ensure_ascii=False)}")
        return "\n".join(parts)

    def valid_actions(self) -> list[str] | None:
        """Clicks, list choices and typing the utterance's values; None when the episode is over."""
        if self.done or self.page is None:
            return None
        return enumerable_actions(self.page, self.typing) or None

    def step(self, action: str) -> StepResult:
        """Carry out one action in the browser; an unusable action gets an explanation instead."""
        if self.page is None:
            raise RuntimeError("step() before reset(): start an episode first")
        if self.done:
            return StepResult(OVER, 0.0, True, info={"success": self.success})
        try:
            parsed = parse_action(action, self.page)
        except ActionError as error:
            return StepResult(self._observe(str(error)), 0.0, False, info={"success": False})
        note = self._perform(parsed.verb, parsed.ref, parsed.argument)
        self.page = parse_page(self.browser.snapshot())
        if not self.page.done:
            return StepResult(self._observe(note), 0.0, False, info={"success": False})
        self.done = True
        raw = self.page.raw_reward
        self.success = raw > 0
        verdict = "The task is completed." if self.success else "The task is failed."
        return StepResult(
            f"{verdict} MiniWoB reward: {raw:g}. {OVER}",
            map_reward(raw, self.config.reward),
            True,
            info={"success": self.success, "raw_reward": raw, "reason": self.page.reason},
        )

    def _perform(self, verb: str, ref: int, argument: str) -> str:
        """Run the action in the browser; returns a note for the agent when the page refused it."""
        error = None
        if verb == "click":
            error = self.browser.click(ref)
        elif verb == "type":
            error = self.browser.type(ref, argument)
        elif verb == "select":
            self.browser.select(ref, argument)
        else:
            self.browser.press(ref, argument)
        return f"The page refused {verb} [{ref}]: {error}" if error else ""

    def render(self) -> bytes | None:
        """A screenshot of the task's page (PNG), for `agentgym view`; None before a reset."""
        return self.browser.screenshot() if self.page is not None else None

    # -- expert ----------------------------------------------------------------------

    def expert_action(self) -> str:
        """The scripted expert's next action for the current page (default tasks only)."""
        if self.page is None or self.done:
            raise RuntimeError("expert_action() needs a running episode")
        return expert.expert_action(self.task, self.page)

    def close(self) -> None:
        """Quit the browser and its driver; safe to call twice."""
        self.browser.close()
