"""pytest fixtures for plugin authors, loaded through the `pytest11` entry point.

- `agentgym_plugin(obj, name="inline")`: a `PluginHost` with `obj` registered
  next to the installed plugins; unregistered after the test.
- `agentgym_host`: a fresh `PluginHost` of the installed plugins.
- `tiny_model_dir`: a tiny from-scratch model folder (Hugging Face format), so
  policy and algorithm plugins can be tested with no model download.
- `agentgym_tiny_model(env_block, **options)`: the folder of a tiny model whose
  tokenizer was trained on that env's own text; built once per session and
  env block, corpus and size.
- `agentgym_train(config, overrides=(), *, plugins=None, tiny_model=None,
  output_dir=None)`: trains one tiny `train` stage of any env, algorithm and
  scheduler and returns a `TrainRun` (`history`, `checkpoint`, `batches`,
  `output_dir`, `model_dir`, `config`, ...). `config` is merged over tiny
  defaults (run name and seed, a run folder under `tmp_path`, 2 updates of
  2 tasks x 2 samples, tracking quiet); without a `model.path` the run starts
  from `agentgym_tiny_model` of its env block. Passing an earlier run's
  `output_dir` resumes it. An env that needs a fixture (Java, a browser, a
  cache) needs the test to request that fixture too.

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
    from agentgym_core.testing.training import TinyModels, TinyTrainer

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


@pytest.fixture(scope="session")
def agentgym_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    """Factory: `agentgym_tiny_model(env_block, **options)` returns a tiny model folder.

    `env_block` is a config's `env` block (`{"name": "babyai", "levels": [...]}`).
    The tokenizer is trained on the text of random episodes of the env's first
    `corpus_tasks` (40) train tasks, at most `corpus_turns` (4) turns each,
    plus `expert_turns` (0) turns of its expert where it has `expert_action()`;
    other options are `TinyModelConfig` fields (`vocab_size`, `hidden_size`,
    ...). The same arguments give the same folder for the whole session.
    """
    from agentgym_core.testing.training import TinyModels

    return TinyModels(tmp_path_factory.mktemp("agentgym-tiny-models"))


@pytest.fixture
def agentgym_train(tmp_path: Path, agentgym_tiny_model: TinyModels) -> TinyTrainer:
    """Factory: `agentgym_train(config, overrides=(), ...)` trains one tiny stage, a `TrainRun`.

    Keyword arguments: `plugins` (name -> plugin object, e.g. a hook recorder),
    `tiny_model` (options of `agentgym_tiny_model` for the built model) and
    `output_dir` (an earlier run's, to resume it; default: a fresh folder under
    `tmp_path` per call). See `agentgym_core.testing.training.TinyTrainer`.
    """
    from agentgym_core.testing.training import TinyTrainer

    return TinyTrainer(tmp_path, agentgym_tiny_model)
