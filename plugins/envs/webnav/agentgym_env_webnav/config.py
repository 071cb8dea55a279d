"""Options of the `webnav` environment."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

DEFAULT_TASKS = [
    "click-button",
    "click-link",
    "click-checkboxes",
    "click-option",
    "click-dialog",
    "click-tab",
    "choose-list",
    "enter-text",
    "enter-password",
    "focus-text",
    "login-user",
    "use-autocomplete",
]
"""Single clicks, typing, and multi-step forms; the scripted expert covers all of them."""


def miniwob_html_dir() -> Path:
    """Folder of the MiniWoB++ task pages shipped in the `miniwob` package."""
    import importlib.util

    spec = importlib.util.find_spec("miniwob")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the `miniwob` package is not installed: pip install miniwob")
    return Path(list(spec.submodule_search_locations)[0]) / "html" / "miniwob"


@cache
def known_tasks() -> tuple[str, ...]:
    """Names of every MiniWoB++ task page in the installed `miniwob` package."""
    return tuple(sorted(page.stem for page in miniwob_html_dir().glob("*.html")))


class WebNavConfig(BaseModel):
    """Which MiniWoB++ tasks to play, how many seeds each split has, and where Chromium is."""

    model_config = ConfigDict(extra="forbid")

    tasks: list[str] = Field(
        default_factory=lambda: list(DEFAULT_TASKS),
        min_length=1,
        description="MiniWoB++ task names (the page names, e.g. click-button, login-user).",
    )
    train_seeds: int = Field(1000, gt=0, description="Train episodes per task (seeds 0..N-1).")
    test_seeds: int = Field(
        100, gt=0, description="Held-out test episodes per task (seeds from 1,000,000)."
    )
    reward: Literal["unit", "raw"] = Field(
        "unit",
        description="`unit`: MiniWoB's raw reward r in [-1, 1] becomes (r + 1) / 2 in [0, 1], so a "
        "wrong answer scores like an episode cut by the horizon (0); `raw`: r as MiniWoB gives it.",
    )
    list_actions: bool = Field(
        False,
        description="End each observation with `Available actions: [...]` (valid_actions()); "
        "off by default because pages with many elements make long lists.",
    )
    instruction: str | None = Field(
        None,
        description="Instruction prompt opening each conversation; null: the built-in one "
        "(describes the page format and the action syntax).",
    )
    chromium: str = Field(
        "chromium", description="Chromium executable: a name looked up on PATH, or a path."
    )
    chromedriver: str = Field(
        "chromedriver", description="ChromeDriver executable: a name looked up on PATH, or a path."
    )
    page_timeout_s: float = Field(
        20.0, gt=0, description="Seconds a page load or a browser command may take."
    )
    settle_ms: int = Field(
        20,
        ge=0,
        description="After each action, wait until page timers due within this many ms have run "
        "(autocomplete suggestions and other deferred updates) before reading the page.",
    )
    window_size: tuple[int, int] = Field(
        (500, 400), description="Browser window width and height in pixels (MiniWoB is 160x210)."
    )

    @field_validator("tasks")
    @classmethod
    def _known(cls, tasks: list[str]) -> list[str]:
        valid = known_tasks()
        for task in tasks:
            if task not in valid:
                raise ValueError(
                    f"unknown MiniWoB++ task {task!r}; valid tasks: {', '.join(valid)}"
                )
        if len(set(tasks)) != len(tasks):
            raise ValueError(f"tasks repeat a name: {tasks}")
        return tasks
