"""Browser lifecycle: started once per env, never leaked, crashes raised as env errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest
from agentgym_env_webnav import WebNavConfig, WebNavEnv
from agentgym_env_webnav.browser import BrowserError, find_executable


def gone(pids: list[int]) -> bool:
    """True when none of `pids` runs any more (zombies awaiting their parent count as gone)."""
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def chromium_main(pids: list[int]) -> psutil.Process:
    """The browser process itself: the child of ChromeDriver that runs chromium."""
    driver = psutil.Process(pids[0])
    return next(p for p in driver.children() if "chrom" in p.name())


def test_missing_chromium_names_the_install_script():
    with pytest.raises(BrowserError, match="scripts/ensure_chromium.sh"):
        find_executable("no-such-chromium-here", "chromium")


def test_browser_starts_once_and_serves_every_episode(chromium):
    env = WebNavEnv(WebNavConfig(train_seeds=5, test_seeds=2))
    try:
        assert env.browser.process_ids() == []  # lazy: nothing runs before the first reset
        env.reset(0)
        driver_pid = env.browser.process_ids()[0]
        for task in env.tasks("train")[1:8]:
            env.reset(task)
            env.step(env.expert_action())
        assert env.browser.starts == 1
        assert env.browser.process_ids()[0] == driver_pid
    finally:
        env.close()


def test_close_leaves_no_process_and_is_idempotent(chromium):
    env = WebNavEnv(WebNavConfig(train_seeds=2, test_seeds=1))
    env.reset(0)
    pids = env.browser.process_ids()
    assert len(pids) >= 3  # chromedriver, chromium, and chromium's helpers
    env.close()
    assert gone(pids), [psutil.Process(p).cmdline()[:1] for p in pids if psutil.pid_exists(p)]
    env.close()
    assert env.browser.process_ids() == []


def test_interpreter_exit_without_close_leaves_no_process(chromium):
    script = textwrap.dedent(
        """
        import json
        from agentgym_env_webnav import WebNavConfig, WebNavEnv
        env = WebNavEnv(WebNavConfig(train_seeds=2, test_seeds=1))
        env.reset(3)
        print(json.dumps(env.browser.process_ids()), flush=True)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    pids = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(pids) >= 3
    assert gone(pids)


def test_crash_raises_then_the_next_reset_starts_a_new_browser(chromium):
    env = WebNavEnv(WebNavConfig(train_seeds=2, test_seeds=1))
    try:
        env.reset(0)
        pids = env.browser.process_ids()
        os.kill(chromium_main(pids).pid, signal.SIGKILL)
        with pytest.raises(BrowserError, match="browser failed while"):
            env.step(env.expert_action())
        env.close()
        assert gone(pids)
        env.reset(0)
        assert env.browser.starts == 2
        assert env.step(env.expert_action()).info["success"]  # click-button is one click
    finally:
        env.close()


def test_an_episode_starts_only_after_the_page_onload_has_run(chromium, tmp_path):
    """`driver.get` can return before a page's onload builds MiniWoB's canvas and cover.

    The copy of click-button here runs its onload's `core.startEpisode()` 300 ms late: an
    episode started at once would fail on the missing canvas (`getContext` of null).
    """
    from agentgym_env_webnav.browser import Browser
    from agentgym_env_webnav.config import miniwob_html_dir

    html = miniwob_html_dir()
    for shared in ("core", "common"):
        (tmp_path / shared).symlink_to(html.parent / shared)
    (tmp_path / "miniwob").mkdir()
    page = (html / "click-button.html").read_text()
    onload = "window.onload = function() {\n  core.startEpisode();"
    assert onload in page
    late = "window.onload = function() {\n  setTimeout(core.startEpisode, 300);"
    (tmp_path / "miniwob" / "click-button-late.html").write_text(page.replace(onload, late))

    browser = Browser(WebNavConfig(train_seeds=1, test_seeds=1), html_dir=tmp_path / "miniwob")
    try:
        first = browser.start_episode("click-button-late", seed=3, mode="train")
        assert first["utterance"].startswith('Click on the "')
        assert browser.driver.execute_script("return core.cover_div.style.display;") == "none"
    finally:
        browser.close()
