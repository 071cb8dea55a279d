"""The plugin manager and the typed facade the core calls hooks through.

Plugins load only when a `PluginHost` is created, never on import. Entry
points of the group `agentgym` are loaded, filtered by two variables:
`AGENTGYM_LOAD_PLUGINS` (comma-separated names: load only these; empty: none)
and `AGENTGYM_DISABLE_PLUGINS` (names never to load). Loading fails loudly on
a misspelled hook, an `agentgym_*` function without `@hookimpl`, and two
entry points of one name: each would otherwise be silently ignored.
"""

from __future__ import annotations

import importlib.metadata as md
import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from agentgym_core import PROJECT, __version__, distributed, hookspecs
from agentgym_core.registry import Registration, Registry, RegistryError
from agentgym_core.types import TrajectoryBatch

ENTRY_POINT_GROUP = "agentgym"
BUILTIN_PLUGINS = ("agentgym_core.policies.builtin", "agentgym_core.run.kinds")

_REGISTER_HOOKS = {
    "environment": "agentgym_register_environments",
    "policy": "agentgym_register_policies",
    "algorithm": "agentgym_register_algorithms",
    "scheduler": "agentgym_register_schedulers",
    "stage": "agentgym_register_stage_kinds",
}


def _name_list(variable: str) -> set[str] | None:
    raw = os.environ.get(variable)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


class PluginHost:
    """Loads plugins and exposes typed calls of every hook.

    Args:
        extra_plugins: objects (modules, instances) to register besides the
            entry points, e.g. inline plugins in tests; keyed by name.
        load_entry_points: False to skip installed plugins (unit tests).
    """

    def __init__(
        self,
        extra_plugins: Mapping[str, object] | None = None,
        *,
        load_entry_points: bool = True,
    ) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self._sources: dict[str, tuple[str, str]] = {}
        for module_name in BUILTIN_PLUGINS:
            module = __import__(module_name, fromlist=["_"])
            self._add(module, module_name, ("agentgym-core", __version__))
        if load_entry_points:
            self._load_entry_points()
        for name, plugin in (extra_plugins or {}).items():
            if self.pm.is_registered(plugin):
                continue  # already loaded from its entry point: register it once
            self._add(plugin, name, (f"<inline {name}>", "0"))
        self.pm.check_pending()
        self.registry = self._collect_registrations()

    def _add(self, plugin: object, name: str, source: tuple[str, str]) -> None:
        # pluggy ignores undecorated functions, so a forgotten @hookimpl (or a
        # misspelled, undecorated hook) would otherwise do nothing, silently.
        unmarked = [
            attr
            for attr in dir(plugin)
            if attr.startswith(f"{PROJECT}_")
            and inspect.isroutine(getattr(plugin, attr, None))
            and self.pm.parse_hookimpl_opts(plugin, attr) is None
        ]
        if unmarked:
            raise pluggy.PluginValidationError(
                plugin, f"plugin {name!r} defines {unmarked} without @agentgym_core.hookimpl"
            )
        self.pm.register(plugin, name=name)
        self._sources[name] = source

    def _load_entry_points(self) -> None:
        allow = _name_list("AGENTGYM_LOAD_PLUGINS")
        block = _name_list("AGENTGYM_DISABLE_PLUGINS") or set()
        for ep in md.entry_points(group=ENTRY_POINT_GROUP):
            if ep.name in block or (allow is not None and ep.name not in allow):
                continue
            dist = ep.dist
            source = (dist.metadata["Name"], dist.version) if dist else (ep.value, "?")
            if self.pm.get_plugin(ep.name) is not None:
                first = " ".join(self._sources.get(ep.name, (ep.name, "?")))
                second = " ".join(source)
                raise RegistryError(
                    f"plugin name {ep.name!r} is declared twice: by {first} and by {second}"
                )
            self._add(ep.load(), ep.name, source)

    def _collect_registrations(self) -> Registry:
        registry = Registry()
        for kind, hook_name in _REGISTER_HOOKS.items():
            caller = getattr(self.pm.hook, hook_name)
            for impl in caller.get_hookimpls():
                default = (impl.plugin_name, "?")
                distribution, version = self._sources.get(impl.plugin_name, default)
                impl.function(register=self._registrar(registry, kind, distribution, version))
        return registry

    @staticmethod
    def _registrar(registry: Registry, kind: str, distribution: str, version: str) -> Callable:
        def register(name: str, factory: Any, *, config: type) -> None:
            registry.add(Registration(kind, name, factory, config, distribution, version))

        return register

    # -- what was loaded -------------------------------------------------------

    def plugin_names(self) -> list[str]:
        """Names of every registered plugin (built-ins included)."""
        return sorted(name for name, _ in self.pm.list_name_plugin())

    def source(self, plugin_name: str) -> tuple[str, str]:
        """(distribution, version) a plugin came from."""
        return self._sources[plugin_name]

    def unregister(self, plugin: object | str) -> None:
        """Remove a plugin (its registrations stay in `registry`; make a new host to drop them)."""
        name = plugin if isinstance(plugin, str) else self.pm.get_name(plugin)
        self.pm.unregister(name=name)
        self._sources.pop(name, None)

    # -- typed lifecycle hooks ------------------------------------------------
    # Under `accelerate launch` only the main process calls them: every rank holds the
    # same batch and metrics, and observers (tracking, saved rollouts) write files.

    def after_rollout(
        self, step: int, batch: TrajectoryBatch, metrics: Mapping[str, float]
    ) -> None:
        """Call `agentgym_after_rollout`."""
        if distributed.is_main():
            self.pm.hook.agentgym_after_rollout(step=step, batch=batch, metrics=metrics)

    def after_update(self, step: int, metrics: Mapping[str, float]) -> None:
        """Call `agentgym_after_update`."""
        if distributed.is_main():
            self.pm.hook.agentgym_after_update(step=step, metrics=metrics)

    def after_evaluation(self, step: int, split: str, metrics: Mapping[str, float]) -> None:
        """Call `agentgym_after_evaluation`."""
        if distributed.is_main():
            self.pm.hook.agentgym_after_evaluation(step=step, split=split, metrics=metrics)

    def on_checkpoint(self, step: int, path: Path) -> None:
        """Call `agentgym_on_checkpoint`."""
        if distributed.is_main():
            self.pm.hook.agentgym_on_checkpoint(step=step, path=path)


def describe(module: ModuleType | object) -> str:
    """Short name of a plugin object for messages."""
    return getattr(module, "__name__", type(module).__name__)
