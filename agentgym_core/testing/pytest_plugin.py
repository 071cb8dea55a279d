"""pytest fixtures for plugin authors, loaded through the `pytest11` entry point.

- `agentgym_plugin(obj, name="inline")`: a `PluginHost` with `obj` registered
  next to the installed plugins; unregistered after the test.
- `agentgym_host`: a fresh `PluginHost` of the installed plugins.
- `tiny_model_dir`: a tiny from-scratch model folder (Hugging Face format), so
  policy and algorithm plugins can be tested with no model download.

Everything from agentgym is imported inside the fixtures: pytest imports this
module in every session, and loading it must not load any plugin or torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from agentgym_core.plugins import PluginHost

TINY_CORPUS = [
    "Your goal: go to the red ball. You see: a red ball 1 step forward, a grey wall.",
    "turn left. turn right. move forward. go to red ball 1. pick up blue key 1. drop. toggle.",
    "Crafting commands: craft 1 stick using 2 planks. Goal: craft 4 stick. Inventory: [].",
    "You did go to red ball. Nothing happens. The episode is over. Success.",
] * 20
"""Text the tiny model's tokenizer is trained on: short agent-like turns."""


@pytest.fixture
def agentgym_host() -> PluginHost:
    """A plugin host with every installed plugin (honours AGENTGYM_LOAD/DISABLE_PLUGINS)."""
    from agentgym_core.plugins import PluginHost

    return PluginHost()


@pytest.fixture
def agentgym_plugin() -> Iterator[Callable[..., PluginHost]]:
    """Factory: `agentgym_plugin(obj, name="inline")` returns a host with `obj` registered.

    Each call builds a new host, installed entry points included, so a test
    sees its plugin next to the real ones (and their name conflicts). The
    plugin is unregistered at teardown, even when the test fails.
    """
    from agentgym_core.plugins import PluginHost

    made: list[tuple[PluginHost, str]] = []

    def make(obj: object, name: str = "inline") -> PluginHost:
        host = PluginHost(extra_plugins={name: obj})
        made.append((host, name))
        return host

    yield make
    for host, name in made:
        if host.pm.get_plugin(name) is not None:
            host.unregister(name)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Folder of a tiny Qwen2-architecture model and its tokenizer, built once per session.

    Loads with `AutoModelForCausalLM.from_pretrained` and
    `AutoTokenizer.from_pretrained`, offline.
    """
    from agentgym_core.modeling.tiny import TinyModelConfig, init_model

    out = tmp_path_factory.mktemp("agentgym-tiny-model")
    return Path(init_model(TINY_CORPUS, out, TinyModelConfig(vocab_size=300)))
