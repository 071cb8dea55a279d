"""Named factories for each component kind, with the pydantic model of their config."""

from __future__ import annotations

from collections.abc import Callable
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
    """One registered component."""

    kind: str
    name: str
    factory: Callable[..., Any]
    config: type[BaseModel]
    distribution: str
    version: str


class Registry:
    """Holds what plugins registered, keyed by kind then name."""

    def __init__(self) -> None:
        self._items: dict[str, dict[str, Registration]] = {kind: {} for kind in KINDS}

    def add(self, registration: Registration) -> None:
        """Add a registration; a duplicate name of the same kind is an error naming both sources."""
        if registration.kind not in self._items:
            raise RegistryError(f"unknown component kind {registration.kind!r}; kinds: {KINDS}")
        config = registration.config
        if not (isinstance(config, type) and issubclass(config, BaseModel)):
            raise RegistryError(
                f"{registration.kind} {registration.name!r} from {registration.distribution}: "
                "config must be a pydantic BaseModel subclass"
            )
        existing = self._items[registration.kind].get(registration.name)
        if existing is not None:
            raise RegistryError(
                f"{registration.kind} {registration.name!r} is registered twice: by "
                f"{existing.distribution} {existing.version} and by "
                f"{registration.distribution} {registration.version}"
            )
        self._items[registration.kind][registration.name] = registration

    def get(self, kind: str, name: str) -> Registration:
        """Look up a registration; the error lists every installed name of that kind."""
        try:
            return self._items[self._kind(kind)][name]
        except KeyError:
            installed = ", ".join(sorted(self._items[kind])) or "none"
            raise RegistryError(f"unknown {kind} {name!r}; installed: {installed}") from None

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
