"""Named factories for each component kind, with the pydantic model of their config."""

from __future__ import annotations

import importlib
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

KINDS = ("environment", "policy", "algorithm", "scheduler", "stage")
"""Component kinds; each has a registration hook. The first four have a config block each;
a stage kind validates the `options` of the pipeline stages of its kind."""


class RegistryError(Exception):
    """A registration conflict or a lookup of a name nobody registered."""


@dataclass(frozen=True)
class Registration:
    """One registered component.

    `target` is the factory itself, or where it lives, `"package.module:Name"`,
    imported on the first use of `factory`: loading every plugin (to validate a
    config, to serve an env) then imports no torch for the algorithms and
    policies that need it.
    """

    kind: str
    name: str
    target: Callable[..., Any] | str
    config: type[BaseModel]
    distribution: str
    version: str

    @property
    def factory(self) -> Callable[..., Any]:
        """The factory; a `"module:Name"` target is imported here (cached by `sys.modules`)."""
        if not isinstance(self.target, str):
            return self.target
        module, _, attribute = self.target.partition(":")
        try:
            return getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as error:
            raise RegistryError(
                f"{self.kind} {self.name!r} from {self.distribution} {self.version}: cannot "
                f"import its factory {self.target!r} ({type(error).__name__}: {error})"
            ) from error


def check(registration: Registration) -> None:
    """Raise RegistryError unless kind, config model and factory (or `"module:Name"`) are valid."""
    if registration.kind not in KINDS:
        raise RegistryError(f"unknown component kind {registration.kind!r}; kinds: {KINDS}")
    where = f"{registration.kind} {registration.name!r} from {registration.distribution}"
    config = registration.config
    if not (isinstance(config, type) and issubclass(config, BaseModel)):
        raise RegistryError(f"{where}: config must be a pydantic BaseModel subclass")
    target = registration.target
    if isinstance(target, str):
        module, colon, attribute = target.partition(":")
        if not (module and colon and attribute.isidentifier()):
            raise RegistryError(
                f"{where}: factory {target!r} must be a callable or 'package.module:Name'"
            )
    elif not callable(target):
        raise RegistryError(f"{where}: factory {target!r} is not callable")


class Registry:
    """Holds what plugins registered, keyed by kind then name.

    Args:
        unavailable: installed plugins that registered nothing here, by plugin
            (entry point) name -> why (`plugin 'foo' (agentgym-env-foo 0.1) failed to
            load: ...`). A lookup of a name like theirs fails with that line.
        notes: said after every other failed lookup (plugins that failed to load
            and may have provided the name; a host that loads only some plugins).
    """

    def __init__(
        self, unavailable: Mapping[str, str] | None = None, notes: Sequence[str] = ()
    ) -> None:
        self._items: dict[str, dict[str, Registration]] = {kind: {} for kind in KINDS}
        self.unavailable = dict(unavailable or {})
        self.notes = list(notes)
        self.clashes: dict[tuple[str, str], str] = {}
        """(kind, name) registered by two plugins -> the error a lookup of it raises. Neither
        is used, and nothing else is stopped: `agentgym plugins` still lists the rest."""

    def add_clash(self, kind: str, name: str, claims: Sequence[tuple[str, Registration]]) -> str:
        """Record that plugins (entry-point name, registration) all registered `kind` `name`."""
        sources = " and by ".join(
            f"plugin {plugin!r} ({r.distribution} {r.version})" for plugin, r in claims
        )
        disable = " or ".join(f"AGENTGYM_DISABLE_PLUGINS={plugin}" for plugin, _ in claims)
        message = (
            f"{kind} {name!r} is registered twice: by {sources}; uninstall one, or leave one "
            f"out with {disable}"
        )
        self.clashes[(kind, name)] = message
        return message

    def add(self, registration: Registration) -> None:
        """Add a registration; a duplicate name of the same kind is an error naming both sources."""
        check(registration)
        existing = self._items[registration.kind].get(registration.name)
        if existing is not None:
            raise RegistryError(
                f"{registration.kind} {registration.name!r} is registered twice: by "
                f"{existing.distribution} {existing.version} and by "
                f"{registration.distribution} {registration.version}"
            )
        self._items[registration.kind][registration.name] = registration

    def get(self, kind: str, name: str) -> Registration:
        """Look up a registration; the error lists every installed name of that kind.

        A name no loaded plugin registered, but like an installed plugin that did
        not load (broken, disabled, left out), is an error saying why that plugin
        did not load.
        """
        try:
            return self._items[self._kind(kind)][name]
        except KeyError:
            if (kind, name) in self.clashes:
                raise RegistryError(self.clashes[(kind, name)]) from None
            raise RegistryError(self._not_found(kind, name)) from None

    def _not_found(self, kind: str, name: str) -> str:
        if name in self.unavailable:
            return f"{kind} {name!r} is not available: {self.unavailable[name]}"
        installed = ", ".join(sorted(self._items[kind])) or "none"
        return "; ".join([f"unknown {kind} {name!r}; installed: {installed}", *self.notes])

    def find(self, name: str) -> list[Registration]:
        """Every registration named `name`, of any kind; none is an error as in `get`."""
        found = [registration for registration in self.all() if registration.name == name]
        if found:
            return found
        if name in self.unavailable:
            raise RegistryError(f"{name!r} is not available: {self.unavailable[name]}")
        installed = ", ".join(sorted({r.name for r in self.all()})) or "none"
        message = f"no component is named {name!r}; installed: {installed}"
        raise RegistryError("; ".join([message, *self.notes]))

    def names(self, kind: str) -> list[str]:
        """Sorted names registered for `kind`."""
        return sorted(self._items[self._kind(kind)])

    @staticmethod
    def _kind(kind: str) -> str:
        if kind not in KINDS:
            raise RegistryError(f"unknown component kind {kind!r}; kinds: {KINDS}")
        return kind

    def all(self) -> list[Registration]:
        """Every registration, sorted by kind then name."""
        return [self._items[k][n] for k in KINDS for n in sorted(self._items[k])]


@dataclass(frozen=True)
class Option:
    """One field of an options model, as `agentgym plugins NAME` shows it.

    Attributes:
        name: the key written in a config block.
        type: the annotation, readable (`int`, `list[str] | None`).
        default: the default as YAML (`0.04`, `[GoToObj]`, `null`); empty when required.
        required: the key has no default.
        description: the field's `Field(description=...)`, empty when it has none.
    """

    name: str
    type: str
    default: str
    required: bool
    description: str


def options(config: type[BaseModel]) -> list[Option]:
    """The documented fields of a registered options model, in declaration order."""
    out = []
    for name, field in config.model_fields.items():
        required = field.is_required()
        default = "" if required else yaml_value(field.get_default(call_default_factory=True))
        kind = _type_name(field.annotation)
        out.append(Option(field.alias or name, kind, default, required, field.description or ""))
    return out


def yaml_value(value: Any) -> str:
    """`value` as one line of YAML flow style (`[GoToObj, OpenDoor]`, `null`, `0.04`)."""
    import yaml

    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    text = yaml.safe_dump(value, default_flow_style=True, width=2**16, allow_unicode=True)
    return text.removesuffix("\n").removesuffix("\n...").strip()


def _type_name(annotation: Any) -> str:
    """An annotation as people write it: `list[str] | None`, `'static' | 'continuous'`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(arg) for arg in args)
    if origin is typing.Literal:
        return " | ".join(repr(arg) for arg in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is not None:
        inner = ", ".join("..." if arg is Ellipsis else _type_name(arg) for arg in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation).removeprefix("typing."))
