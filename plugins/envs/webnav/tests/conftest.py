"""Fixtures of the webnav tests: Chromium must be installed, and browsers are shared per module."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def chromium() -> None:
    """Fail (not skip) when Chromium or ChromeDriver is missing: CI installs them via make."""
    from agentgym_env_webnav.browser import BrowserError, find_executable

    try:
        find_executable("chromium", "chromium")
        find_executable("chromedriver", "chromedriver")
    except BrowserError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="module")
def env(chromium):
    """One webnav env (one browser) on the default tasks for the whole test module."""
    from agentgym_env_webnav import WebNavConfig, WebNavEnv

    env = WebNavEnv(WebNavConfig(train_seeds=50, test_seeds=20))
    yield env
    env.close()
