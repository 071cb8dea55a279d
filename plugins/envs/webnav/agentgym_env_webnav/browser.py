"""One headless Chromium, driven through ChromeDriver, that plays MiniWoB++ pages.

The browser starts once and is reused for every episode of its environment;
only the task page is reloaded at each reset (so an episode never sees the
state of the previous one). Every failure of the browser or the driver
raises `BrowserError`: the rollout engine records it as `env_error`. No
Chromium process outlives `close()`, garbage collection or interpreter exit.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

from agentgym_env_webnav.config import WebNavConfig, miniwob_html_dir

INSTALL_HINT = (
    "run scripts/ensure_chromium.sh (from the agentgym repository) to install Debian's "
    "chromium and chromium-driver, or set env.chromium / env.chromedriver to their paths"
)

KEYS = {
    "Enter": "ENTER",
    "Tab": "TAB",
    "Escape": "ESCAPE",
    "Backspace": "BACKSPACE",
    "Delete": "DELETE",
    "Space": "SPACE",
    "ArrowUp": "ARROW_UP",
    "ArrowDown": "ARROW_DOWN",
    "ArrowLeft": "ARROW_LEFT",
    "ArrowRight": "ARROW_RIGHT",
    "Home": "HOME",
    "End": "END",
    "PageUp": "PAGE_UP",
    "PageDown": "PAGE_DOWN",
}
"""Keys `press` accepts, and their names in selenium's `Keys`."""

_START_EPISODE = """
core.EPISODE_MAX_TIME = 1e9;  // no wall-clock limit: the turn horizon bounds an episode
if (window.jQuery) {
  jQuery.fx.off = true;  // no animations: the page is settled when an action returns
  if (jQuery.ui && jQuery.ui.autocomplete) jQuery.ui.autocomplete.prototype.options.delay = 0;
}
Math.seedrandom(arguments[0]);
core.setDataMode(arguments[1]);
core.startEpisodeReal();
return WOB_TASK_READY;
"""

_PAGE_LOADED = """
return window.core !== undefined && core.cover_div !== null;
"""
"""The page's `window.onload` has run `core.startEpisode()`, which builds the click canvas and
the cover that `startEpisodeReal` uses. A start once failed on the missing canvas (the full
suite, enter-text): `driver.get` had returned before the page's onload ran, so wait for it."""

_SETTLE = """
var done = arguments[arguments.length - 1];
setTimeout(done, arguments[0]);  // timers are due in order: earlier ones have run by then
"""

_SNAPSHOT = """
var utterance = core.getUtterance();
var dom = core.getDOMInfo();
var selects = {};
for (var ref in core.previousDOMInfo) {
  var el = core.previousDOMInfo[ref];
  if (el instanceof HTMLSelectElement) {
    selects[ref] = {
      options: Array.from(el.options).map(function (o) { return o.text; }),
      value: el.selectedIndex >= 0 ? el.options[el.selectedIndex].text : ''
    };
  }
}
return {utterance: utterance, dom: dom, selects: selects, done: WOB_DONE_GLOBAL,
        raw_reward: WOB_RAW_REWARD_GLOBAL, reason: WOB_REWARD_REASON};
"""


class BrowserError(RuntimeError):
    """Chromium or ChromeDriver failed (crash, hang, lost session): not the agent's doing."""


def find_executable(name: str, what: str) -> str:
    """Absolute path of `name` (a path or a name on PATH); a clear error when it is missing."""
    if Path(name).is_file():
        return str(Path(name).resolve())
    found = shutil.which(name)
    if found is None:
        raise BrowserError(f"{what} not found (looked for {name!r} on PATH): {INSTALL_HINT}")
    return found


def _running(process: psutil.Process) -> bool:
    """Alive and not a zombie (a zombie holds nothing; reaping it is its parent's job)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to `timeout` seconds for `processes` to stop running; returns those still running."""
    deadline = time.monotonic() + timeout
    alive = [p for p in processes if _running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _running(p)]
    return alive


def _terminate(processes: list[psutil.Process]) -> None:
    """Terminate, then kill, whichever of `processes` still run; reap our own children."""
    for process in [p for p in processes if _running(p)]:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    for process in _wait_gone(processes, timeout=3):
        with contextlib.suppress(psutil.Error):
            process.kill()
    _wait_gone(processes, timeout=3)
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if process.ppid() == os.getpid():
                process.wait(timeout=0)  # reap ChromeDriver so no zombie stays behind


def _shutdown(driver: Any, root_pid: int) -> None:
    """Quit the driver and make sure ChromeDriver and every Chromium process it started are gone."""
    try:
        tree = [psutil.Process(root_pid)]
        tree += tree[0].children(recursive=True)
    except psutil.Error:
        tree = []
    with contextlib.suppress(Exception):  # a crashed driver cannot quit cleanly; kill below
        driver.quit()
    _terminate(tree)


class Browser:
    """A lazily started headless Chromium on MiniWoB++ pages; one page at a time."""

    def __init__(self, config: WebNavConfig, html_dir: Path | None = None) -> None:
        """`html_dir`: where the task pages are (MiniWoB++'s bundled `miniwob/` by default)."""
        self.config = config
        self.starts = 0
        """How many times a Chromium was started (1 for a healthy browser's whole life)."""
        self.driver: Any = None
        self._finalizer: weakref.finalize | None = None
        self._broken = False
        self._html_dir = html_dir or miniwob_html_dir()

    # -- lifecycle -----------------------------------------------------------------

    @property
    def alive(self) -> bool:
        """Started and not known to be broken."""
        return self.driver is not None and not self._broken

    def start(self) -> None:
        """Start ChromeDriver and headless Chromium (a broken browser is replaced)."""
        if self.alive:
            return
        self.close()
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        options = webdriver.ChromeOptions()
        options.binary_location = find_executable(self.config.chromium, "chromium")
        width, height = self.config.window_size
        for argument in (
            "--headless=new",
            "--no-sandbox",  # Chromium refuses to run as root (containers, CI) without it
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-extensions",
            "--no-first-run",
            "--disable-background-networking",  # no network: nothing to update or sync
            "--disable-component-update",
            "--disable-sync",
            "--mute-audio",
            f"--window-size={width},{height}",
        ):
            options.add_argument(argument)
        service = Service(find_executable(self.config.chromedriver, "chromedriver"))
        with self._guard("starting chromium"):
            driver = webdriver.Chrome(service=service, options=options)
        self.driver, self._broken = driver, False
        self.starts += 1
        self._finalizer = weakref.finalize(self, _shutdown, driver, service.process.pid)
        with self._guard("configuring chromium"):
            driver.set_page_load_timeout(self.config.page_timeout_s)
            driver.set_script_timeout(self.config.page_timeout_s)

    def close(self) -> None:
        """Quit Chromium and ChromeDriver; safe to call twice and after a crash."""
        if self._finalizer is not None:
            self._finalizer()  # runs _shutdown once; also registered for exit and GC
        self.driver, self._finalizer = None, None

    def process_ids(self) -> list[int]:
        """ChromeDriver's pid followed by every process it started (Chromium and its helpers)."""
        if self.driver is None:
            return []
        try:
            root = psutil.Process(self.driver.service.process.pid)
            return [root.pid] + [p.pid for p in root.children(recursive=True)]
        except psutil.Error:
            return []

    @contextlib.contextmanager
    def _guard(self, doing: str) -> Iterator[None]:
        """Turn any driver failure into BrowserError and remember that this browser is broken."""
        from selenium.common.exceptions import WebDriverException

        try:
            yield
        except (WebDriverException, OSError, ConnectionError) as error:
            self._broken = True
            message = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise BrowserError(
                f"browser failed while {doing}: {type(error).__name__}: {message}"
            ) from error
        except Exception as error:
            if "urllib3" in type(error).__module__:  # the driver's HTTP connection died
                self._broken = True
                raise BrowserError(f"browser failed while {doing}: {error!r}") from error
            raise

    # -- episodes ------------------------------------------------------------------

    def start_episode(self, task: str, seed: int, mode: str) -> dict[str, Any]:
        """Load `task`'s page afresh, start its episode with `seed`; returns the first snapshot."""
        self.start()
        with self._guard(f"loading {task}"):
            self.driver.get((self._html_dir / f"{task}.html").as_uri())
            deadline = time.monotonic() + self.config.page_timeout_s
            self._wait(task, _PAGE_LOADED, deadline, "did not finish loading")
            if not self.driver.execute_script(_START_EPISODE, seed, mode):
                # some tasks build their page asynchronously
                self._wait(task, "return WOB_TASK_READY;", deadline, "did not become ready")
        return self.snapshot()

    def _wait(self, task: str, condition: str, deadline: float, failure: str) -> None:
        """Poll the page until the script `condition` returns true; BrowserError at `deadline`."""
        while not self.driver.execute_script(condition):
            if time.monotonic() > deadline:
                raise BrowserError(f"task {task} {failure}")
            time.sleep(0.02)

    def snapshot(self) -> dict[str, Any]:
        """Utterance, DOM tree (with fresh refs), select options, and MiniWoB's done/reward.

        First lets the page's pending timers run (see `WebNavConfig.settle_ms`):
        a page that updates itself a moment after an event (autocomplete) would
        otherwise read differently from one run to the next.
        """
        with self._guard("reading the page"):
            if self.config.settle_ms:
                self.driver.execute_async_script(_SETTLE, self.config.settle_ms)
            return self.driver.execute_script(_SNAPSHOT)

    def screenshot(self) -> bytes:
        """The task area (MiniWoB's `#wrap`, 160x210) as PNG; the whole window without one."""
        from selenium.webdriver.common.by import By

        with self._guard("taking a screenshot"):
            found = self.driver.find_elements(By.ID, "wrap")
            return found[0].screenshot_as_png if found else self.driver.get_screenshot_as_png()

    def click(self, ref: int) -> str | None:
        """MiniWoB's element click (events and focus); returns an error message or None."""
        with self._guard(f"clicking [{ref}]"):
            result = self.driver.execute_script("return core.elementClick(arguments[0]);", ref)
        return None if result is True else str(result)

    def type(self, ref: int, text: str) -> str | None:
        """Click the field, clear it, and type `text` as real key strokes."""
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.keys import Keys

        error = self.click(ref)
        if error is not None:
            return error
        with self._guard(f"typing into [{ref}]"):
            chain = ActionChains(self.driver, duration=0)
            chain.key_down(Keys.CONTROL).send_keys("a").key_up(Keys.CONTROL)
            chain.send_keys(Keys.BACKSPACE)
            if text:
                chain.send_keys(text)
            chain.perform()
        return None

    def press(self, ref: int, key: str) -> None:
        """Focus the element and press one of `KEYS`."""
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.keys import Keys

        code = getattr(Keys, KEYS[key])
        with self._guard(f"pressing {key} on [{ref}]"):
            self.driver.execute_script("core.previousDOMInfo[arguments[0]].focus();", ref)
            ActionChains(self.driver, duration=0).send_keys(code).perform()

    def select(self, ref: int, option: str) -> None:
        """Choose the option with visible text `option` in the <select> `ref` (fires change)."""
        from selenium.webdriver.support.ui import Select

        with self._guard(f"selecting in [{ref}]"):
            element = self.driver.execute_script("return core.previousDOMInfo[arguments[0]];", ref)
            Select(element).select_by_visible_text(option)
