"""The action language: parse an action against the current page, and list the finite ones.

`click [ref]`, `type [ref] [text]`, `select [ref] [option]`, `press [ref] [key]`.
A malformed action or one that does not fit the page gets an explanation
(`ActionError`), never an exception that would end the episode as env_error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from agentgym_env_webnav.browser import KEYS
from agentgym_env_webnav.page import TEXT_FIELDS, Element, Page

VERBS = ("click", "type", "select", "press")
SYNTAX = "click [ref], type [ref] [text], select [ref] [option], press [ref] [key]"

_ACTION = re.compile(r"^(?P<verb>[a-z]+)\s*\[\s*(?P<ref>-?\d+)\s*\](?P<rest>.*)$", re.S | re.I)
_QUOTED = re.compile(r'"([^"]+)"')


class ActionError(ValueError):
    """The action cannot be carried out; the message tells the agent why."""


@dataclass(frozen=True)
class Action:
    """A parsed action on a shown element."""

    verb: str
    ref: int
    argument: str = ""


def _argument(rest: str) -> str | None:
    """`[text]` (brackets may enclose anything, brackets too), a bare word run, or None."""
    rest = rest.strip()
    if not rest:
        return None
    if rest.startswith("[") and rest.endswith("]"):
        return rest[1:-1]
    return rest


def parse_action(text: str, page: Page) -> Action:
    """Parse `text` and check it against `page`; raises ActionError with the reason."""
    action = " ".join(text.strip().splitlines()).strip()
    match = _ACTION.match(action)
    if match is None or match["verb"].lower() not in VERBS:
        raise ActionError(f"Invalid action {text.strip()!r}. Actions: {SYNTAX}.")
    verb, ref, argument = match["verb"].lower(), int(match["ref"]), _argument(match["rest"])
    element = page.by_ref().get(ref)
    if element is None:
        raise ActionError(f"There is no element [{ref}] on the page; use a ref shown below.")
    if verb == "click":
        if argument is not None:
            raise ActionError(f"click takes only a ref: click [{ref}].")
        return Action(verb, ref)
    if argument is None:
        raise ActionError(f"{verb} needs an argument: {verb} [{ref}] [...].")
    _check_target(verb, element, argument)
    return Action(verb, ref, argument)


def _check_target(verb: str, element: Element, argument: str) -> None:
    name = f"[{element.ref}] is a {element.tag}"
    if verb == "type" and element.tag not in TEXT_FIELDS:
        raise ActionError(f"{name}, not a text field: type needs an input or a textarea.")
    if verb == "select":
        if element.tag != "select":
            raise ActionError(f"{name}, not a drop-down list: select needs a select element.")
        if argument not in (element.options or []):
            raise ActionError(
                f"[{element.ref}] has no option {argument!r}; options: {element.options}."
            )
    if verb == "press" and argument not in KEYS:
        raise ActionError(f"Unknown key {argument!r}; keys: {', '.join(KEYS)}.")


def typing_candidates(task: str, utterance: str) -> list[str]:
    """Texts worth typing: the values MiniWoB's field extractor finds in the utterance.

    This is the element-plus-field action space of Liu et al. (2018) that
    MiniWoB++ ships: it keeps `valid_actions()` finite. Tasks without an
    extractor fall back to the quoted strings of the utterance.
    """
    from miniwob.fields import get_field_extractor

    try:
        values = [value for _, value in get_field_extractor(task)(utterance)]
    except (KeyError, ValueError):
        values = _QUOTED.findall(utterance)
    return list(dict.fromkeys(v for v in values if v))


def enumerable_actions(page: Page, typing: Sequence[str]) -> list[str]:
    """Clicks on every shown element, every option of each list, and typing each candidate.

    Free text and key presses are accepted by `step` but not listed: only
    these are finite.
    """
    actions: list[str] = []
    for element in page.elements():
        if element.ref is None:
            continue
        if element.tag == "select":
            actions += [f"select [{element.ref}] [{option}]" for option in element.options or []]
            continue
        actions.append(f"click [{element.ref}]")
        if element.tag in TEXT_FIELDS:
            actions += [f"type [{element.ref}] [{text}]" for text in typing]
    return list(dict.fromkeys(actions))
