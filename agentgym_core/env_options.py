"""Environments named on the command line: `NAME --env-option key=value ...`, checked as config is.

`agentgym env play`, `serve-env`, `model init`, `data expert` and `data export`
all build an environment from a registered name and `key=value` pairs. They
share this module (not the CLI's own helpers), and a mistake reads like a
config mistake: the key path (`env.levels`), what is wrong, a did-you-mean,
and the `--env-option` it came from.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from agentgym_core.config.errors import ConfigError, Problem, pydantic_problems, unknown_keys
from agentgym_core.rollout import contract


def plugin_host() -> Any:
    """The plugin host: every installed plugin, loaded."""
    from agentgym_core.plugins import PluginHost

    return PluginHost()


def parse_options(pairs: Sequence[str] | None, flag: str = "--env-option") -> dict[str, Any]:
    """`key=value` pairs as a dict; values read as YAML (`levels=[GoToObj]`, `depth=2`)."""
    import yaml

    options: dict[str, Any] = {}
    problems = []
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            problems.append(Problem("", f"expected key=value, got {pair!r}", where=flag))
            continue
        try:
            options[key] = yaml.safe_load(value)
        except yaml.YAMLError as error:
            problems.append(Problem(key, f"not a YAML value: {error}", where=f"{flag} {pair!r}"))
    if problems:
        raise ConfigError(problems)
    return options


def validate_env_options(
    registry: Any, name: str, options: dict[str, Any], pairs: Sequence[str] | None = None
) -> tuple[Any, BaseModel]:
    """The registration of env `name` and its validated config; mistakes as a ConfigError."""
    registration = registry.get("environment", name)  # an unknown name lists the installed ones
    model = registration.config
    problems = unknown_keys(options, model, ("env",))
    try:
        config = model.model_validate(options)
    except ValidationError as error:
        problems += pydantic_problems(error, model, ("env",))
    if problems:
        raise ConfigError([_located(p, pairs or []) for p in problems], f"environment {name!r}")
    return registration, config


def _located(problem: Problem, pairs: Sequence[str]) -> Problem:
    """The problem, with the `--env-option` pair its key came from."""
    key = problem.path.split(".")[1] if problem.path.count(".") else ""
    for pair in pairs:
        if pair.partition("=")[0] == key:
            return Problem(problem.path, problem.message, where=f"--env-option {pair!r}")
    return problem


def make_env(host: Any, name: str, pairs: Sequence[str] | None) -> Any:
    """A new environment `name` configured by `key=value` pairs.

    The instance is labelled with `name`, so the contract's messages about it
    (a wrong type from `reset`, `step`, ...) name the env as the user typed it.
    """
    registration, config = validate_env_options(host.registry, name, parse_options(pairs), pairs)
    return contract.label(registration.factory(config), name)
