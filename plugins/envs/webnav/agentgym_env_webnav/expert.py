"""Scripted experts: the next gold action of a task, read off the live page.

Each solver looks at the page as it is now (which boxes are checked, what a
field holds, which suggestions are open) and returns the next step towards
the goal, so it recovers from any state an agent left behind. The goal comes
from MiniWoB's field extractor (the values in the task's utterance).
"""

from __future__ import annotations

from collections.abc import Callable

from agentgym_env_webnav.page import Element, Page

Fields = dict[str, str]
Solver = Callable[[Page, Fields], str]


class NoExpertError(LookupError):
    """The task has no scripted expert, or the page offers no way forward."""


def _find(page: Page, predicate: Callable[[Element], bool], what: str) -> Element:
    for element in page.elements():
        if element.ref is not None and predicate(element):
            return element
    raise NoExpertError(f"expert found no {what} on the page")


def _submit(page: Page) -> str:
    button = _find(page, lambda e: e.tag == "button", "button")
    return f"click [{button.ref}]"


def _click_text(tag: str, target: Callable[[Fields], str]) -> Solver:
    """A solver clicking the `tag` element whose text is `target(fields)`."""

    def solve(page: Page, fields: Fields) -> str:
        text = target(fields)
        element = _find(page, lambda e: e.tag == tag and e.text == text, f"{tag} {text!r}")
        return f"click [{element.ref}]"

    return solve


def _boxes(page: Page, fields: Fields) -> str:
    """click-checkboxes and click-option: fix the first box in the wrong state, then submit."""
    wanted = {value for key, value in fields.items() if key.startswith("target")}
    for element in page.elements():
        if element.tag in ("input_checkbox", "input_radio") and element.parent is not None:
            should_be_checked = element.parent.all_text() in wanted
            if bool(element.value) != should_be_checked:
                return f"click [{element.ref}]"
    return _submit(page)


def _fill(page: Page, values: list[str]) -> str:
    """Type `values` into the text fields in page order, then submit."""
    boxes = [e for e in page.elements() if e.tag.startswith("input_") and e.ref is not None]
    for element, value in zip(boxes, values, strict=False):
        if element.value != value:
            return f"type [{element.ref}] [{value}]"
    return _submit(page)


def _choose_list(page: Page, fields: Fields) -> str:
    select = _find(page, lambda e: e.tag == "select", "drop-down list")
    if select.value != fields["target"]:
        return f"select [{select.ref}] [{fields['target']}]"
    return _submit(page)


def _focus_text(page: Page, fields: Fields) -> str:
    field = _find(page, lambda e: e.tag == "input_text", "text field")
    return f"click [{field.ref}]"


def _close_dialog(page: Page, fields: Fields) -> str:
    close = _find(page, lambda e: "ui-dialog-titlebar-close" in e.classes, "close button")
    return f"click [{close.ref}]"


def _autocomplete(page: Page, fields: Fields) -> str:
    """Type the prefix, click a suggestion with the right ending, submit."""
    start, end = fields["start"], fields.get("end", "")
    field = _find(page, lambda e: e.tag == "input_text", "text field")
    entered = str(field.value or "")
    if entered.startswith(start) and entered.endswith(end):
        return _submit(page)
    for element in page.elements():
        suggestion = "ui-menu-item-wrapper" in element.classes
        if suggestion and element.text.startswith(start) and element.text.endswith(end):
            return f"click [{element.ref}]"
    return f"type [{field.ref}] [{start}]"


SOLVERS: dict[str, Solver] = {
    "click-button": _click_text("button", lambda fields: fields["target"]),
    "click-link": _click_text("span", lambda fields: fields["target"]),
    "click-checkboxes": _boxes,
    "click-option": _boxes,
    "click-dialog": _close_dialog,
    "click-tab": _click_text("a", lambda fields: f"Tab #{fields['target']}"),
    "choose-list": _choose_list,
    "enter-text": lambda page, fields: _fill(page, [fields["target"]]),
    "enter-password": lambda page, fields: _fill(page, [fields["target"]] * 2),
    "focus-text": _focus_text,
    "login-user": lambda page, fields: _fill(page, [fields["username"], fields["password"]]),
    "use-autocomplete": _autocomplete,
}
"""The tasks with a scripted expert (the default task list)."""


def expert_action(task: str, page: Page) -> str:
    """The next gold action of `task` on `page`."""
    from miniwob.fields import get_field_extractor

    solver = SOLVERS.get(task)
    if solver is None:
        raise NoExpertError(
            f"no scripted expert for MiniWoB++ task {task!r}; experts cover: {', '.join(SOLVERS)}"
        )
    fields = dict(get_field_extractor(task)(page.utterance))
    return solver(page, fields)
