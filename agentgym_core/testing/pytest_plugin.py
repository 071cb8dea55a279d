"""pytest fixtures for plugin authors, loaded automatically once agentgym-core is installed.

- `agentgym_plugin(obj, name="inline")`: a `PluginHost` with an inline plugin
  registered next to the installed ones; unregistered after the test.
- `agentgym_host`: a fresh `PluginHost` of the installed plugins.
- `tiny_model_dir`: a tiny from-scratch model folder (Hugging Face format).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

TINY_CORPUS = [
    "Your goal: go to the red ball. You see: red ball 1 2 steps forward.",
    "turn left turn right move forward go to red ball 1 pick up blue key 1 drop toggle",
    "Crafting commands: craft 1 stick using 2 planks. Goal: craft stick.",
] * 20


@pytest.fixture
def agentgym_host():
    """A plugin host with every installed plugin."""
    from agentgym_core.plugins import PluginHost

    return PluginHost()


@pytest.fixture
def agentgym_plugin() -> Iterator[Callable[..., object]]:
    """Factory: `agentgym_plugin(obj, name="inline")` returns a host with `obj` registered."""
    from agentgym_core.plugins import PluginHost

    hosts: list[tuple[PluginHost, str]] = []

    def make(obj: object, name: str = "inline") -> PluginHost:
        host = PluginHost(extra_plugins={name: obj})
        hosts.append((host, name))
        return host

    yield make
    for host, name in hosts:
        if host.pm.get_plugin(name) is not None:
            host.unregister(name)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Folder of a tiny Qwen2-architecture model with a tokenizer trained on a small corpus."""
    from agentgym_core.modeling.tiny import TinyModelConfig, init_model

    out = tmp_path_factory.mktemp("agentgym-tiny-model")
    return init_model(TINY_CORPUS, out, TinyModelConfig(vocab_size=300))
