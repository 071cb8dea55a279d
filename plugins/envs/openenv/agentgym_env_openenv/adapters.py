"""How an OpenEnv env's action and observation shapes become agentgym's text, and back.

Most OpenEnv environments take an action with one text field and send an
observation with a text field: the defaults map those with no code. For any
other shape, an author writes two small functions and names them in the env
block (`action_adapter`, `observation_adapter`: `module:function`):

    def to_action(text: str) -> dict:            # the agent's text -> the action payload
        return {"move": text.strip().lower()}

    def from_observation(observation: dict) -> tuple[str, list[str] | None]:
        return observation["board"], observation.get("legal_moves")
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from typing import Any

ActionAdapter = Callable[[str], dict[str, Any]]
ObservationAdapter = Callable[[dict[str, Any]], tuple[str, list[str] | None]]

TEXT_FIELDS = ("text", "observation", "message", "prompt", "content")
"""Observation fields read as the text, in this order, when none is configured."""
ACTION_LIST_FIELDS = ("available_actions", "legal_actions", "valid_actions")
"""Observation fields read as the valid actions when none is configured."""


def load(path: str, key: str) -> Callable[..., Any]:
    """The function `module:function` names; errors name the config key `env.<key>`."""
    module_name, _, name = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"env.{key}: cannot import {module_name!r}: {error}") from error
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"env.{key}: {module_name} has no function {name!r}")
    return function


def action_field_from_schema(schema: dict[str, Any], url: str) -> str:
    """The one string field of an OpenEnv action schema (`metadata` aside)."""
    properties = {k: v for k, v in schema.get("properties", {}).items() if k != "metadata"}
    strings = [k for k, v in properties.items() if _is_string(v)]
    if len(properties) == 1 and strings:
        return strings[0]
    required = [k for k in schema.get("required", []) if k in strings]
    if len(required) == 1 and set(schema.get("required", [])) == set(required):
        return required[0]
    raise ValueError(
        f"{url}/schema: the action has fields {sorted(properties)}, not one text field: set "
        "env.action_field to the one the agent's text goes in, or env.action_adapter to a "
        "function that builds the action (docs/openenv.md)"
    )


def _is_string(spec: dict[str, Any]) -> bool:
    if spec.get("type") == "string":
        return True
    return any(option.get("type") == "string" for option in spec.get("anyOf", []))


class ObservationReader:
    """Text and valid actions from observation dicts, by the configured or detected fields."""

    def __init__(self, text_field: str | None, actions_field: str | None) -> None:
        self.text_field = text_field
        self.actions_field = actions_field

    def __call__(self, observation: dict[str, Any]) -> tuple[str, list[str] | None]:
        """The observation's text and its valid actions (None: not listed)."""
        return self.text(observation), self.actions(observation)

    def text(self, observation: dict[str, Any]) -> str:
        """The configured field, else the first of TEXT_FIELDS, the one str field, or JSON."""
        if self.text_field is not None:
            if self.text_field not in observation:
                raise ValueError(
                    f"env.observation_field is {self.text_field!r}, but the observation has "
                    f"fields {sorted(observation)}"
                )
            value = observation[self.text_field]
            return value if isinstance(value, str) else json.dumps(value)
        for name in TEXT_FIELDS:
            if isinstance(observation.get(name), str):
                return observation[name]
        strings = [k for k, v in observation.items() if isinstance(v, str)]
        if len(strings) == 1:
            return observation[strings[0]]
        shown = {k: v for k, v in observation.items() if k != "metadata"}
        return json.dumps(shown, sort_keys=True)

    def actions(self, observation: dict[str, Any]) -> list[str] | None:
        """The configured list field, else the first of ACTION_LIST_FIELDS present."""
        names = (self.actions_field,) if self.actions_field else ACTION_LIST_FIELDS
        for name in names:
            value = observation.get(name)
            if isinstance(value, list) and all(isinstance(a, str) for a in value):
                return value or None
        return None
