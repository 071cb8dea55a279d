"""A MiniWoB++ page as the agent sees it: the task's utterance and a tree of DOM elements.

`core.getDOMInfo()` (MiniWoB's own DOM reader) gives every visible element a
ref that stays fixed for the episode; text mixed with elements comes as
pseudo-elements (tag `t`) whose refs change at every read, so they are shown
as plain text without a ref. The page's own wrappers (`body`, `#wrap`,
`#area`) are not shown, nor are empty decorations (a leaf with no text, no id
and no form role, such as a dialog's resize handles).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

WRAPPER_IDS = frozenset({"wrap", "area"})
"""MiniWoB's page chrome around every task; shown as their children only."""

TEXT_FIELDS = frozenset(
    {
        "input_text",
        "input_password",
        "input_email",
        "input_search",
        "input_tel",
        "input_url",
        "input_number",
        "textarea",
    }
)
"""Tags `type` accepts."""

_GENERATED_ID = re.compile(r"^ui-id-\d+$")
"""jQuery UI's counter ids: they carry no meaning for the agent."""


@dataclass
class Element:
    """One element (or, with `ref` None, one piece of text) of the page."""

    ref: int | None
    tag: str
    depth: int
    text: str = ""
    value: str | bool | None = None
    id: str = ""
    classes: str = ""
    focused: bool = False
    options: list[str] | None = None
    parent: Element | None = field(default=None, repr=False)
    children: list[Element] = field(default_factory=list, repr=False)

    @property
    def is_form_control(self) -> bool:
        """An input, text area, drop-down list or button."""
        return self.tag.startswith("input") or self.tag in ("textarea", "select", "button")

    def all_text(self) -> str:
        """This element's text and its descendants', joined by spaces (a label's caption)."""
        parts = [self.text] if self.text else []
        parts += [child.all_text() for child in self.children]
        return " ".join(p for p in parts if p)

    def line(self) -> str:
        """How the element is shown: `[ref] tag #id "text" value/state`."""
        if self.ref is None:
            return json.dumps(self.text, ensure_ascii=False)
        parts = [f"[{self.ref}] {self.tag}"]
        if self.id:
            parts.append(f"#{self.id}")
        if self.text:
            parts.append(json.dumps(self.text, ensure_ascii=False))
        if self.tag in ("input_checkbox", "input_radio"):
            parts.append("checked" if self.value else "unchecked")
        elif self.tag == "select":
            parts.append(f"value={json.dumps(self.value, ensure_ascii=False)}")
            parts.append(f"options={json.dumps(self.options, ensure_ascii=False)}")
        elif self.tag.startswith("input") or self.tag == "textarea":
            parts.append(f"value={json.dumps(self.value or '', ensure_ascii=False)}")
        if self.focused:
            parts.append("focused")
        return " ".join(parts)


@dataclass
class Page:
    """One read of the page: what to show, and MiniWoB's episode state."""

    utterance: str
    roots: list[Element]
    done: bool = False
    raw_reward: float = 0.0
    reason: Any = None

    def elements(self) -> Iterator[Element]:
        """Every shown element and text piece, depth first, in page order."""
        stack = list(reversed(self.roots))
        while stack:
            element = stack.pop()
            yield element
            stack.extend(reversed(element.children))

    def by_ref(self) -> dict[int, Element]:
        """Shown elements keyed by ref."""
        return {e.ref: e for e in self.elements() if e.ref is not None}

    def render(self) -> str:
        """The text the agent reads: the task, then one line per element, indented by nesting."""
        lines = [f"Task: {self.utterance}", "Page:"]
        lines += ["  " * e.depth + e.line() for e in self.elements()]
        return "\n".join(lines)


def _utterance(raw: Any) -> str:
    """`core.getUtterance()` answers a string, or on some tasks a dict with the string in it."""
    return str(raw["utterance"] if isinstance(raw, dict) else raw)


def parse_page(snapshot: dict[str, Any]) -> Page:
    """Build a Page from the browser's snapshot (see `browser._SNAPSHOT`)."""
    selects = {int(ref): info for ref, info in (snapshot.get("selects") or {}).items()}
    roots = _convert_children(snapshot["dom"], None, 0, selects)
    return Page(
        utterance=_utterance(snapshot["utterance"]),
        roots=roots,
        done=bool(snapshot["done"]),
        raw_reward=float(snapshot["raw_reward"] or 0.0),
        reason=snapshot.get("reason"),
    )


def _convert_children(
    raw: dict[str, Any], parent: Element | None, depth: int, selects: dict[int, dict[str, Any]]
) -> list[Element]:
    out: list[Element] = []
    for child in raw.get("children", []):
        out += _convert(child, parent, depth, selects)
    return out


def _convert(
    raw: dict[str, Any], parent: Element | None, depth: int, selects: dict[int, dict[str, Any]]
) -> list[Element]:
    """The shown elements for one raw DOM node: itself, its children if it is a wrapper, or none."""
    tag = str(raw["tag"]).lower()
    if tag == "body" or raw.get("id") in WRAPPER_IDS:
        return _convert_children(raw, parent, depth, selects)
    text = " ".join(str(raw.get("text") or "").split())
    if tag == "t":
        return [Element(None, "t", depth, text=text, parent=parent)] if text else []
    dom_id = str(raw.get("id") or "")
    element = Element(
        ref=int(raw["ref"]),
        tag=tag,
        depth=depth,
        text=text,
        value=raw.get("value"),
        id="" if _GENERATED_ID.match(dom_id) else dom_id,
        classes=raw["classes"] if isinstance(raw.get("classes"), str) else "",
        focused=bool(raw.get("focused")),
        parent=parent,
    )
    if tag == "select" and element.ref in selects:
        element.options = list(selects[element.ref]["options"])
        element.value = selects[element.ref]["value"]
    element.children = _convert_children(raw, element, depth + 1, selects)
    if element.children or element.text or element.id or element.is_form_control:
        return [element]
    return []
