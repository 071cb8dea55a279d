"""MiniWoB++ web tasks in a real headless Chromium, as a text environment for agentgym."""

from agentgym_env_webnav.config import DEFAULT_TASKS, WebNavConfig
from agentgym_env_webnav.env import WebNavEnv

__all__ = ["DEFAULT_TASKS", "WebNavConfig", "WebNavEnv"]
