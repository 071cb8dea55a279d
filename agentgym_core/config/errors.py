"""One error type for every config mistake, each problem named by its full key path.

A user fixing a config needs the key, what is wrong, and where it was
written (file line or command-line override), all problems at once rather
than one per run.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections import abc
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError


@dataclass(frozen=True)
class Problem:
    """One mistake: the dotted key path (`stages.1.trainer.steps`) and what is wrong."""

    path: str
    message: str
    where: str = ""
    """Where the value came from: `file.yaml:12`, `override 'a.b=1'`; empty when unknown."""

    def __str__(self) -> str:
        head = f"{self.where}: " if self.where else ""
        key = f"{self.path}: " if self.path else ""
        return f"{head}{key}{self.message}"


class ConfigError(Exception):
    """Every problem found in a config, in one message.

    Attributes:
        problems: the problems, in the order found.
        source: the config file, when loaded from one.
    """

    def __init__(self, problems: Iterable[Problem], source: str | None = None) -> None:
        self.problems = list(problems)
        self.source = source
        super().__init__(self._format())

    def _format(self) -> str:
        origin = f" in {self.source}" if self.source else ""
        count = len(self.problems)
        head = f"invalid config{origin} ({count} problem{'s' if count != 1 else ''}):"
        return "\n".join([head, *(f"  {p}" for p in self.problems)])


def dotted(loc: Sequence[Any]) -> str:
    """Key path as users write it in overrides: `stages.1.trainer.steps`."""
    return ".".join(str(part) for part in loc)


def pydantic_problems(
    error: ValidationError, model: type[BaseModel], prefix: Sequence[Any] = ()
) -> list[Problem]:
    """Translate pydantic errors to problems, suggesting the closest key for unknown ones."""
    problems = []
    for err in error.errors():
        loc = tuple(err["loc"])
        kind = err["type"]
        if kind == "extra_forbidden":
            message = "unknown key" + _suggest(str(loc[-1]), _fields_at(model, loc[:-1]))
        elif kind == "missing":
            message = "missing required key"
        else:
            message = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
            if kind not in ("value_error", "assertion_error") and not isinstance(
                err.get("input"), (dict, list)
            ):
                message += f" (got {_short(err.get('input'))})"
        problems.append(Problem(dotted((*prefix, *loc)), message))
    return problems


def unknown_keys(
    options: dict[str, Any], model: type[BaseModel], prefix: Sequence[Any]
) -> list[Problem]:
    """Keys a model would silently ignore (its `extra` left at pydantic's default)."""
    if model.model_config.get("extra") in ("forbid", "allow"):
        return []
    known = set(model.model_fields)
    known |= {f.alias for f in model.model_fields.values() if f.alias}
    return [
        Problem(dotted((*prefix, key)), "unknown key" + _suggest(key, sorted(known)))
        for key in options
        if key not in known
    ]


def _suggest(key: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
    if close:
        return f" (did you mean {close[0]!r}?)"
    return f"; valid keys: {', '.join(choices)}" if choices else ""


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fields_at(model: type[BaseModel], loc: Sequence[Any]) -> list[str]:
    """Field names of the model found by following `loc` through the annotations."""
    annotation: Any = model
    for part in loc:
        annotation = _step(annotation, part)
        if annotation is None:
            return []
    found = _step(annotation, None)
    return list(found.model_fields) if found is not None else []


def _step(annotation: Any, key: Any) -> Any:
    """The annotation one key further down; with key None, the model itself (if any)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            if arg is not type(None) and (found := _step(arg, key)) is not None:
                return found
        return None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if key is None:
            return annotation
        field = annotation.model_fields.get(key)
        return field.annotation if field is not None else None
    args = typing.get_args(annotation)
    if key is None or not args:
        return None
    if origin in (list, tuple, set, frozenset, abc.Sequence):
        return args[0] if isinstance(key, int) else None
    return args[-1]


class UsageError(Exception):
    """A command-line value the command cannot use; printed as one line, exit status 2."""
