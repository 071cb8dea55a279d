"""Tiny training runs for plugin tests: one `train` stage of any env, algorithm and scheduler.

A plugin's test states the config it cares about (its env, its algorithm or
scheduler and a few trainer numbers) and gets back the run's metrics,
checkpoint and rollout batches. The rest is filled in here: a tiny
from-scratch model whose tokenizer saw the env's own text (built once per
session and env block), a run folder under the test's `tmp_path`, a seed, and
tracking kept quiet. The fixtures `agentgym_tiny_model` and `agentgym_train`
in `pytest_plugin` hand these out.

Everything heavy (torch, transformers, the plugins) is imported inside the
functions: pytest imports the test kit in every session.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym_core import hookimpl

TINY_DEFAULTS: dict[str, Any] = {
    "run": {"name": "tiny", "seed": 0},
    "trainer": {"steps": 2, "tasks_per_step": 2, "group_size": 2},
    "tracking": {"log_trajectories": 0, "traces": False},
}
"""Filled in under the caller's config by `agentgym_train` (with `run.output_dir`, `model.path`)."""

COMPONENT_BLOCKS = ("env", "policy", "algorithm", "scheduler")
"""Config blocks whose `name` also names the installed plugin a narrow test host loads."""

_PENDING_MODEL = "agentgym-tiny-model-pending"
"""`model.path` while the env block is resolved, before the tiny model for it is built."""


@dataclass
class TrainRun:
    """What one tiny training stage did.

    Attributes:
        history: one dict of metrics per update, from the first (a resumed run
            includes the updates restored from its checkpoint).
        checkpoint: the folder of the last checkpoint (a plain Hugging Face model).
        resumed_from: the update the run started at (0 unless it resumed).
        batches: update step -> the `TrajectoryBatch` the `agentgym_after_rollout`
            hook saw for it (only the updates this call played); the same object the
            algorithm then set advantages on.
        output_dir: the run's `run.output_dir`; pass it as `output_dir` to resume.
        model_dir: the model the run started from (`model.path`).
        config: the resolved config (`config.root` is the validated root block).
        algorithm: the config's algorithm, built from the registration and options
            the stage built its own from (a new instance, so its state is untouched).
        scheduler: the config's horizon scheduler, likewise (schedules are pure
            functions of the history, so it decides what the stage's decided).
    """

    history: list[dict[str, float]]
    checkpoint: Path
    resumed_from: int
    batches: dict[int, Any]
    output_dir: Path
    model_dir: Path
    config: Any
    algorithm: Any
    scheduler: Any


def _run_stage(resolved: Any, host: Any) -> Any:
    """Run the `train` stage of `resolved`: the test kit's one call into the stage runtime.

    Returns:
        The stage's result: `checkpoint`, `history`, `resumed_from`.
    """
    from agentgym_core.run.kinds import run_stage

    return run_stage(resolved, host, show_progress=False)


def _component(resolved: Any, block: str) -> Any | None:
    """A new instance of the config's `block` component, as the stage builds its own."""
    if block not in resolved.components:
        return None
    registration, options = resolved.components[block]
    return registration.factory(options)


class _BatchRecorder:
    """Keeps each update's rollout batch, as the hook hands it over."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, Any]] = []

    @hookimpl
    def agentgym_after_rollout(self, step: int, batch: Any) -> None:
        """Keep `batch` (the object itself: the algorithm sets its advantages next)."""
        self.seen.append((step, batch))

    def by_step(self) -> dict[int, Any]:
        steps = [step for step, _ in self.seen]
        if len(set(steps)) != len(steps):
            raise AssertionError(f"agentgym_after_rollout saw an update twice: steps {steps}")
        return dict(self.seen)


def narrow_reason(names: frozenset[str]) -> str:
    """What a lookup says of an installed plugin a test's narrow host left out."""
    loaded = ", ".join(sorted(names)) or "none"
    return (
        f"the test loads only the plugin under test and what it asks for ({loaded}); "
        'add one with @pytest.mark.agentgym_plugins("NAME")'
    )


def installed_plugins() -> set[str]:
    """The names of the installed `agentgym` entry points (nothing is imported)."""
    import importlib.metadata as md

    from agentgym_core.plugins import ENTRY_POINT_GROUP

    return {ep.name for ep in md.entry_points(group=ENTRY_POINT_GROUP)}


def named_plugins(config: Mapping[str, Any], overrides: Sequence[str] = ()) -> set[str]:
    """Installed plugins named like a component the config (or an override) names."""
    names = {
        block["name"]
        for key in COMPONENT_BLOCKS
        if isinstance(block := config.get(key), Mapping) and isinstance(block.get("name"), str)
    }
    for pair in overrides:
        key, _, value = pair.partition("=")
        if key in {f"{block}.name" for block in COMPONENT_BLOCKS}:
            names.add(value.strip())
    return names & installed_plugins()


def deep_merge(base: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """`base` with `changes` on top; mappings merge key by key, anything else is replaced."""
    out = copy.deepcopy(dict(base))
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class TinyModels:
    """Tiny from-scratch models, one per env block, corpus and size; each built once.

    Args:
        root: the folder the models are built under (a session's temporary folder).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._built: dict[str, Path] = {}

    def __call__(self, env: Mapping[str, Any], **options: Any) -> Path:
        """The model of a config's env block (`name` and the env's options); see `for_env`.

        Loads the installed plugin named like the env (every one where none is).
        """
        from agentgym_core.env_options import validate_env_options
        from agentgym_core.plugins import PluginHost

        env_options = {k: v for k, v in env.items() if k != "name"}
        only = named_plugins({"env": env}) or None
        registration, validated = validate_env_options(
            PluginHost(only=only).registry, env["name"], env_options
        )
        return self.for_env(registration, validated, **options)

    def for_env(
        self,
        registration: Any,
        env_options: Any,
        *,
        corpus_tasks: int = 40,
        corpus_turns: int = 4,
        expert_turns: int = 0,
        **size: Any,
    ) -> Path:
        """The folder of a tiny model whose tokenizer is trained on the env's own text.

        Built on first use, then the same folder for the same arguments.

        Args:
            registration: the env's registration (its factory builds the env).
            env_options: the env's validated options.
            corpus_tasks: how many train tasks are played for the tokenizer's corpus.
            corpus_turns: the turn limit of each of those random episodes.
            expert_turns: where the env has `expert_action()`, also play this many
                expert turns of each task and add its actions (for envs whose
                actions are free text, so the tokenizer knows the good ones).
            **size: options of `agentgym_core.modeling.tiny.TinyModelConfig`
                (`vocab_size`, `hidden_size`, `max_position_embeddings`, ...).
        """
        from agentgym_core.modeling.tiny import TinyModelConfig

        config = TinyModelConfig(**size)
        corpus = {"tasks": corpus_tasks, "turns": corpus_turns, "expert_turns": expert_turns}
        key = json.dumps(
            [registration.name, env_options.model_dump(mode="json"), corpus, config.model_dump()],
            sort_keys=True,
            default=str,
        )
        if key not in self._built:
            out = self.root / f"{registration.name}-{len(self._built)}"
            self._built[key] = _build(registration.factory(env_options), out, config, corpus)
        return self._built[key]


def _build(env: Any, out: Path, config: Any, corpus: Mapping[str, int]) -> Path:
    """Play `env` for the tokenizer's corpus, then build and save the model; closes `env`."""
    from agentgym_core.modeling.tiny import env_corpus, init_model

    try:
        tasks = list(env.tasks("train"))[: corpus["tasks"]]
        texts = env_corpus(env, tasks, max_turns=corpus["turns"])
        if corpus["expert_turns"]:
            texts += _expert_actions(env, tasks, corpus["expert_turns"])
    finally:
        env.close()
    return Path(init_model(texts, out, config))


def _expert_actions(env: Any, tasks: Sequence[int], turns: int) -> list[str]:
    """The expert's actions in up to `turns` turns of each task."""
    if not callable(getattr(env, "expert_action", None)):
        raise TypeError(f"expert_turns: {type(env).__name__} has no expert_action()")
    actions = []
    for task in tasks:
        env.reset(task)
        for _ in range(turns):
            action = env.expert_action()
            actions.append(action)
            if env.step(action).done:
                break
    return actions


class TinyTrainer:
    """`agentgym_train`: trains one tiny stage per call, each in a fresh run folder by default.

    Args:
        tmp_path: the test's temporary folder (configs and run folders go under it).
        models: the session's tiny models.
        only: installed plugins (entry point names) to load besides those the
            config names; None: every installed plugin.
    """

    def __init__(
        self, tmp_path: Path, models: TinyModels, only: frozenset[str] | None = None
    ) -> None:
        self.tmp_path = Path(tmp_path)
        self.models = models
        self.only = only
        self.calls = 0

    def __call__(
        self,
        config: Mapping[str, Any],
        overrides: Sequence[str] = (),
        *,
        plugins: Mapping[str, object] | None = None,
        tiny_model: Mapping[str, Any] | None = None,
        output_dir: str | Path | None = None,
    ) -> TrainRun:
        """Train the `train` stage of `config` (over `TINY_DEFAULTS`) and report what it did.

        Args:
            config: run config blocks, merged over the tiny defaults; at least `env`,
                `algorithm` and `scheduler`. A `model.path` here (or in `overrides`)
                is used as is; without one a tiny model is built for the env block.
            overrides: `key.path=value` strings applied after `config`, as on the CLI.
            plugins: extra plugin objects to register, keyed by name (hook recorders).
                Installed plugins: those of `only`, plus each one named like a
                component of the config (`env.name`, `algorithm.name`, ...).
            tiny_model: options of the built model: `corpus_tasks`, `corpus_turns`,
                `expert_turns` and `TinyModelConfig` fields (see `TinyModels`).
            output_dir: the run folder; an earlier run's `output_dir` resumes that run
                from its newest checkpoint. Default: a fresh folder per call.

        Raises:
            ConfigError: the config is invalid (naming the written YAML file).
            ValueError: the config has `stages` (this runs a single stage), or
                names `model.path` and `tiny_model` too.
        """
        from agentgym_core.plugins import PluginHost

        if "stages" in config:
            raise ValueError("agentgym_train runs one train stage; leave `stages` out")
        self.calls += 1
        raw = deep_merge(TINY_DEFAULTS, {"run": {"output_dir": self._run_dir(output_dir)}})
        raw = deep_merge(raw, config)
        recorder = _BatchRecorder()
        extra = {**(plugins or {}), "agentgym-train-batches": recorder}
        only = None if self.only is None else self.only | named_plugins(raw, overrides)
        reason = narrow_reason(only) if only is not None else None
        host = PluginHost(extra_plugins=extra, only=only, only_reason=reason)
        path = self.tmp_path / f"run-{self.calls}.yaml"
        raw = self._with_model(path, raw, overrides, host, tiny_model)
        resolved = self._load(path, raw, overrides, host)
        result = _run_stage(resolved, host)
        return TrainRun(
            history=result.history,
            checkpoint=Path(result.checkpoint),
            resumed_from=result.resumed_from,
            batches=recorder.by_step(),
            output_dir=Path(resolved.root.run.output_dir),
            model_dir=Path(resolved.root.model.path),
            config=resolved,
            algorithm=_component(resolved, "algorithm"),
            scheduler=_component(resolved, "scheduler"),
        )

    def _with_model(
        self,
        path: Path,
        raw: dict[str, Any],
        overrides: Sequence[str],
        host: Any,
        tiny_model: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        """`raw` with `model.path` set to the env's tiny model, unless the caller named a model."""
        named = bool((raw.get("model") or {}).get("path"))
        if not named:
            first = self._load(path, raw, [f"model.path={_PENDING_MODEL}", *overrides], host)
            named = first.root.model.path != _PENDING_MODEL  # an override named a model
            if not named:
                model = self.models.for_env(*first.components["env"], **(tiny_model or {}))
                return deep_merge(raw, {"model": {"path": str(model)}})
        if tiny_model:
            raise ValueError("tiny_model sizes a built model, but the config names model.path")
        return raw

    def _run_dir(self, output_dir: str | Path | None) -> str:
        return str(output_dir or self.tmp_path / f"run-{self.calls}")

    @staticmethod
    def _load(path: Path, raw: Mapping[str, Any], overrides: Sequence[str], host: Any) -> Any:
        """Write `raw` as the run's YAML file and load it as `agentgym train` would."""
        import yaml

        from agentgym_core.config.load import load_config

        plain = json.loads(json.dumps(raw, default=str))  # a Path in the config is its text
        path.write_text(yaml.safe_dump(plain, sort_keys=False), encoding="utf-8")
        return load_config(path, list(overrides), host.registry)
