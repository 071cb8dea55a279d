"""The plugin manager and the typed facade the core calls hooks through.

Plugins load only when a `PluginHost` is created, never on import. Entry
points of the group `agentgym` are loaded, filtered by two variables:
`AGENTGYM_LOAD_PLUGINS` (comma-separated names: load only these; empty: none)
and `AGENTGYM_DISABLE_PLUGINS` (names never to load), and by the host's own
`only` (the test kit's fixtures load the plugin under test, not every one).

One broken installed plugin must not break every command: an entry point
whose module fails to import, that misspells a hook or forgets `@hookimpl`,
or whose registration hook raises, is skipped with one line (a
`BrokenPluginWarning`) naming the plugin, its distribution, the entry point,
the error and `AGENTGYM_DISABLE_PLUGINS=<name>`. Only a lookup of one of its
names fails, with that same line. Inline plugins (tests) and two entry points
of one name still fail loudly.
"""

from __future__ import annotations

import importlib.metadata as md
import inspect
import os
import warnings
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pluggy

from agentgym_core import PROJECT, __version__, distributed, hookspecs
from agentgym_core.registry import Registration, Registry, RegistryError, check
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


class BrokenPluginWarning(UserWarning):
    """An installed plugin failed to load and was skipped (the message is one line)."""


@dataclass(frozen=True)
class BrokenPlugin:
    """An installed plugin the host skipped because it failed to load.

    Attributes:
        name: the entry point's name (what `AGENTGYM_DISABLE_PLUGINS` takes).
        distribution: the distribution that declares the entry point.
        version: that distribution's version.
        entry_point: the entry point as declared, `name = module`.
        error: what failed, `ModuleNotFoundError: No module named 'x'`.
    """

    name: str
    distribution: str
    version: str
    entry_point: str
    error: str

    def __str__(self) -> str:
        return (
            f"plugin {self.name!r} ({self.distribution} {self.version}, entry point "
            f"{self.entry_point}) failed to load: {self.error} (fix or uninstall "
            f"{self.distribution}, or skip it: AGENTGYM_DISABLE_PLUGINS={self.name})"
        )


def _name_list(variable: str) -> set[str] | None:
    raw = os.environ.get(variable)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def _left_out(name: str, allow: set[str] | None, block: set[str]) -> str:
    """Why the environment variables leave plugin `name` out; empty when they do not."""
    if name in block:
        return "AGENTGYM_DISABLE_PLUGINS names it"
    if allow is not None and name not in allow:
        return "AGENTGYM_LOAD_PLUGINS does not name it"
    return ""


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


class PluginHost:
    """Loads plugins and exposes typed calls of every hook.

    Args:
        extra_plugins: objects (modules, instances) to register besides the
            entry points, e.g. inline plugins in tests; keyed by name.
        load_entry_points: False to skip installed plugins (unit tests).
        only: entry point names to load (None: every installed one); the
            environment variables still apply. A lookup of a name like one left
            out says it is installed but not loaded, and why.
        only_reason: what that message says instead of "this host loads only ...".

    Attributes:
        registry: every registered component.
        broken: the installed plugins that failed to load, each skipped with a
            `BrokenPluginWarning`.
    """

    def __init__(
        self,
        extra_plugins: Mapping[str, object] | None = None,
        *,
        load_entry_points: bool = True,
        only: Collection[str] | None = None,
        only_reason: str | None = None,
    ) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self._sources: dict[str, tuple[str, str]] = {}
        self._entry_points: dict[str, str] = {}  # loaded plugin name -> `name = module`
        self._unavailable: dict[str, str] = {}
        self.broken: list[BrokenPlugin] = []
        for module_name in BUILTIN_PLUGINS:
            module = __import__(module_name, fromlist=["_"])
            self._add(module, module_name, ("agentgym-core", __version__))
        if load_entry_points:
            if only is not None:
                only_reason = only_reason or f"this host loads only {', '.join(sorted(only))}"
            self._load_entry_points(only, only_reason or "")
        for name, plugin in (extra_plugins or {}).items():
            if self.pm.is_registered(plugin):
                continue  # already loaded from its entry point: register it once
            self._add(plugin, name, (f"<inline {name}>", "0"))
        self.pm.check_pending()
        self.registry = self._collect_registrations(only_reason if only is not None else None)

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

    def _unknown_hooks(self, plugin: object, name: str) -> None:
        """Raise what `check_pending` would for this plugin alone: a hook no spec declares."""
        unknown = []
        for attr in dir(plugin):
            opts = self.pm.parse_hookimpl_opts(plugin, attr)
            if opts is None or opts.get("optionalhook"):
                continue
            hook = opts.get("specname") or attr
            if not hasattr(hookspecs, hook):
                unknown.append(hook)
        if unknown:
            raise pluggy.PluginValidationError(
                plugin, f"plugin {name!r} implements unknown hooks {unknown}"
            )

    def _load_entry_points(self, only: Collection[str] | None, only_reason: str) -> None:
        allow = _name_list("AGENTGYM_LOAD_PLUGINS")
        block = _name_list("AGENTGYM_DISABLE_PLUGINS") or set()
        for ep in md.entry_points(group=ENTRY_POINT_GROUP):
            dist = ep.dist
            source = (dist.metadata["Name"], dist.version) if dist else (ep.value, "?")
            why = _left_out(ep.name, allow, block) or (
                only_reason if only is not None and ep.name not in only else ""
            )
            if why:
                self._unavailable.setdefault(
                    ep.name, f"plugin {ep.name!r} ({' '.join(source)}) is not loaded: {why}"
                )
                continue
            if ep.name in self._entry_points or any(b.name == ep.name for b in self.broken):
                first = " ".join(self._sources.get(ep.name) or self._broken_source(ep.name))
                raise RegistryError(
                    f"plugin name {ep.name!r} is declared twice: by {first} and by "
                    f"{' '.join(source)}"
                )
            declared = f"{ep.name} = {ep.value}"
            try:
                plugin = ep.load()
                self._unknown_hooks(plugin, ep.name)
                self._add(plugin, ep.name, source)
            except Exception as error:  # any failure of a third party's import or hooks
                self._skip(BrokenPlugin(ep.name, *source, declared, _one_line(error)))
                continue
            self._entry_points[ep.name] = declared

    def _broken_source(self, name: str) -> tuple[str, str]:
        broken = next(b for b in self.broken if b.name == name)
        return broken.distribution, broken.version

    def _skip(self, broken: BrokenPlugin) -> None:
        """Leave a broken plugin out, with one warning line; lookups of its name say why."""
        if self.pm.get_plugin(broken.name) is not None:
            self.pm.unregister(name=broken.name)
            self._sources.pop(broken.name, None)
        self._entry_points.pop(broken.name, None)
        self.broken.append(broken)
        self._unavailable[broken.name] = str(broken)
        warnings.warn(str(broken), BrokenPluginWarning, stacklevel=4)

    def _collect_registrations(self, only_reason: str | None) -> Registry:
        found: list[tuple[str, Registration]] = []
        for kind, hook_name in _REGISTER_HOOKS.items():
            caller = getattr(self.pm.hook, hook_name)
            for impl in caller.get_hookimpls():
                plugin = impl.plugin_name
                if plugin not in self._sources:  # skipped after an earlier hook of it raised
                    continue
                distribution, version = self._sources[plugin]
                mine: list[Registration] = []
                try:
                    impl.function(register=self._registrar(mine, kind, distribution, version))
                except Exception as error:
                    if plugin not in self._entry_points:
                        raise  # the core's own or an inline plugin: a bug to see at once
                    declared = self._entry_points[plugin]
                    error_line = f"{hook_name} raised {_one_line(error)}"
                    self._skip(BrokenPlugin(plugin, distribution, version, declared, error_line))
                    continue
                found += [(plugin, registration) for registration in mine]
        notes = []
        if self.broken:
            names = ", ".join(f"{b.name} ({b.distribution})" for b in self.broken)
            notes.append(f"plugins that failed to load: {names}")
        if only_reason:
            notes.append(only_reason)
        registry = Registry(self._unavailable, notes)
        claims: dict[tuple[str, str], list[tuple[str, Registration]]] = {}
        for plugin, registration in found:
            if plugin in self._sources:
                claims.setdefault((registration.kind, registration.name), []).append(
                    (plugin, registration)
                )
        for (kind, name), claimed in claims.items():
            if len(claimed) == 1:
                registry.add(claimed[0][1])
            else:  # two packages, one name: only that name is refused, with what to do
                message = registry.add_clash(kind, name, claimed)
                warnings.warn(message, BrokenPluginWarning, stacklevel=4)
        return registry

    @staticmethod
    def _registrar(
        found: list[Registration], kind: str, distribution: str, version: str
    ) -> Callable:
        def register(name: str, factory: Any, *, config: type) -> None:
            registration = Registration(kind, name, factory, config, distribution, version)
            check(registration)  # a bad config model fails inside the plugin's own hook
            found.append(registration)

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

    def add_commands(self, subparsers: Any) -> None:
        """Call `agentgym_add_commands`, one plugin at a time.

        A name already taken is a `BrokenPluginWarning` naming the plugin; the
        other plugins' commands still come.
        """
        import argparse

        for hook in self.pm.hook.agentgym_add_commands.get_hookimpls():
            try:
                hook.function(subparsers=subparsers)
            except argparse.ArgumentError as error:
                message = f"plugin {hook.plugin_name!r} adds a command the CLI has: {error}"
                warnings.warn(message, BrokenPluginWarning, stacklevel=2)

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
