"""AgentTraj, AgentGym's trajectory format: read, validate, write, and tokenize for training.

An AgentTraj file is a JSON list of items::

    {"item_id": "babyai_12", "conversations": [
        {"from": "human", "loss": null,  "value": "<instruction>"},
        {"from": "gpt",   "loss": false, "value": "Ok."},
        {"from": "human", "loss": null,  "value": "<first observation>"},
        {"from": "gpt",   "loss": true,  "value": "<action>"}, ...]}

Turns alternate, starting with `human`. An assistant (`gpt`) turn is trained on
when its `loss` is true, or when `loss` is absent or null (AgentTraj files
without the field train every assistant turn); `loss: false` keeps it as
context only. A preference-pairs file is a JSON list of
`{"item_id", "chosen": [turns], "rejected": [turns]}`, both whole conversations
of the same task. `Message` (one turn) and `AgentTrajItem` are plain data in
`agentgym_core.types`, importable from here too; `AgentTrajPair` lives here.

Tokenization (`tokenize`) reuses the rollout engine's `ChatFormat`: the chat
template is applied once to the turns before the first trained assistant
turn, then each action is appended as the tokens the policy would sample and
each observation as the template's delta for a new user turn. A conversation
the agent played therefore tokenizes to exactly the ids of its rollout.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym_core.rollout.chat import PRIMING_REPLY, ChatFormat
from agentgym_core.types import AgentTrajItem, Message, Turn, task_number

ROLES: tuple[str, ...] = ("human", "gpt")


class AgentTrajError(ValueError):
    """Invalid AgentTraj data, naming the file, the item index and the field.

    Attributes:
        source: the file (or a label such as `<expert babyai>`).
        index: index of the item in the JSON list; None for whole-file problems.
        field: the field within the item, e.g. `conversations[2].from`.
    """

    def __init__(self, source: str, index: int | None, field: str, message: str) -> None:
        self.source, self.index, self.field = source, index, field
        where = [source]
        if index is not None:
            where.append(f"item {index}")
        if field:
            where.append(field)
        super().__init__(f"{': '.join(where)}: {message}")


@dataclass
class AgentTrajPair:
    """Two whole conversations of the same task: the preferred and the rejected one."""

    item_id: str
    chosen: list[Message]
    rejected: list[Message]

    @property
    def task_id(self) -> int | None:
        """The task number at the end of the item id, if any."""
        return task_number(self.item_id)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this pair."""
        return {
            "item_id": self.item_id,
            "chosen": [m.to_dict() for m in self.chosen],
            "rejected": [m.to_dict() for m in self.rejected],
        }


# -- reading ---------------------------------------------------------------------------


def read_items(path: str | Path) -> list[AgentTrajItem]:
    """Read and validate an AgentTraj file.

    Raises:
        AgentTrajError: the first problem, naming the file, item index and field.
    """
    return parse_items(_load_json(Path(path)), str(path))


def read_pairs(path: str | Path) -> list[AgentTrajPair]:
    """Read and validate a preference-pairs file (`item_id`, `chosen`, `rejected`)."""
    return parse_pairs(_load_json(Path(path)), str(path))


def parse_items(data: Any, source: str = "<data>") -> list[AgentTrajItem]:
    """Validate already-decoded AgentTraj JSON; `source` names it in errors."""
    items = []
    for index, raw in enumerate(_items_list(data, source)):
        item_id = _item_id(raw, source, index)
        turns = parse_conversation(raw.get("conversations"), source, index, "conversations")
        extra = {k: v for k, v in raw.items() if k not in ("item_id", "conversations")}
        items.append(AgentTrajItem(item_id, turns, extra))
    return items


def parse_pairs(data: Any, source: str = "<data>") -> list[AgentTrajPair]:
    """Validate already-decoded preference pairs; `source` names them in errors."""
    pairs = []
    for index, raw in enumerate(_items_list(data, source)):
        item_id = _item_id(raw, source, index)
        chosen = parse_conversation(raw.get("chosen"), source, index, "chosen")
        rejected = parse_conversation(raw.get("rejected"), source, index, "rejected")
        pairs.append(AgentTrajPair(item_id, chosen, rejected))
    return pairs


def parse_conversation(turns: Any, source: str, index: int, key: str) -> list[Message]:
    """Validate one list of turns: objects with `from`, `value`, optional `loss`, alternating."""
    if turns is None:
        raise AgentTrajError(source, index, key, "missing (a list of turns)")
    if not isinstance(turns, list) or not turns:
        raise AgentTrajError(
            source, index, key, f"expected a non-empty list of turns, got {_kind(turns)}"
        )
    messages = []
    for position, turn in enumerate(turns):
        where = f"{key}[{position}]"
        if not isinstance(turn, dict):
            raise AgentTrajError(source, index, where, f"expected an object, got {_kind(turn)}")
        role = turn.get("from")
        if role not in ROLES:
            raise AgentTrajError(
                source, index, f"{where}.from", f"expected 'human' or 'gpt', got {role!r}"
            )
        expected = ROLES[position % 2]
        if role != expected:
            raise AgentTrajError(
                source,
                index,
                f"{where}.from",
                f"turns must alternate starting with 'human'; expected {expected!r}, got {role!r}",
            )
        value = turn.get("value")
        if not isinstance(value, str):
            raise AgentTrajError(
                source, index, f"{where}.value", f"expected a string, got {_kind(value)}"
            )
        loss = turn.get("loss")
        if loss is not None and not isinstance(loss, bool):
            raise AgentTrajError(
                source, index, f"{where}.loss", f"expected true, false or null, got {loss!r}"
            )
        messages.append(Message(role, value, loss))
    return messages


def _load_json(path: Path) -> Any:
    if not path.is_file():
        raise AgentTrajError(str(path), None, "", "no such file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise AgentTrajError(
            str(path), None, "", f"not valid JSON: line {exc.lineno} column {exc.colno}: {exc.msg}"
        ) from None


def _items_list(data: Any, source: str) -> list[dict[str, Any]]:
    if not isinstance(data, list):
        raise AgentTrajError(source, None, "", f"expected a JSON list of items, got {_kind(data)}")
    for index, raw in enumerate(data):
        if not isinstance(raw, dict):
            raise AgentTrajError(source, index, "", f"expected an object, got {_kind(raw)}")
    return data


def _item_id(raw: dict[str, Any], source: str, index: int) -> str:
    item_id = raw.get("item_id")
    if not isinstance(item_id, str) or not item_id:
        raise AgentTrajError(
            source, index, "item_id", f"expected a non-empty string, got {item_id!r}"
        )
    return item_id


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", type(None): "null"}
    return names.get(type(value), f"{type(value).__name__} {value!r}")


# -- writing ---------------------------------------------------------------------------


def write_items(items: Iterable[AgentTrajItem], path: str | Path) -> Path:
    """Write items as an AgentTraj JSON file (parent folders created)."""
    return _write_json([item.to_dict() for item in items], Path(path))


def write_pairs(pairs: Iterable[AgentTrajPair], path: str | Path) -> Path:
    """Write preference pairs as JSON (parent folders created)."""
    return _write_json([pair.to_dict() for pair in pairs], Path(path))


def _write_json(data: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False), encoding="utf-8")
    return path


def episode_messages(
    instruction: str, first_observation: str, turns: Sequence[Turn]
) -> list[Message]:
    """An episode as AgentGym writes it: instruction, priming "Ok.", then observation/action turns.

    Actions are `loss: true`; the observation after the last action is left
    out (the agent never answered it).
    """
    messages = [
        Message("human", instruction),
        Message("gpt", PRIMING_REPLY, False),
        Message("human", first_observation),
    ]
    for position, turn in enumerate(turns):
        messages.append(Message("gpt", turn.action, True))
        if position + 1 < len(turns):
            messages.append(Message("human", turn.observation))
    return messages


# -- tokenizing ------------------------------------------------------------------------


def tokenize(chat: ChatFormat, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
    """Token ids of a conversation and its loss mask (1 on trained assistant tokens).

    The turns before the first trained assistant turn go through the chat
    template once (with the generation prompt), as a rollout's prompt does;
    later assistant turns are `chat.action_ids` (ending with the stop token)
    and later user turns `chat.observation_ids`. A trailing user turn adds
    nothing: no action answers it.
    """
    first = next((i for i, m in enumerate(messages) if m.trains), len(messages))
    opening = list(messages[:first])
    if opening and opening[-1].role == "gpt":
        opening.pop()  # only reached when no turn trains: the context ends at the last question
    ids = _template_ids(chat, opening) if opening else []
    mask = [0] * len(ids)
    last_gpt = max((i for i, m in enumerate(messages) if m.role == "gpt"), default=-1)
    for message in messages[first : last_gpt + 1]:
        if message.role == "gpt":
            tokens = chat.action_ids(message.value)
            mask.extend([int(message.trains)] * len(tokens))
        else:
            tokens = chat.observation_ids(message.value)
            mask.extend([0] * len(tokens))
        ids.extend(tokens)
    return ids, mask


def _template_ids(chat: ChatFormat, messages: Sequence[Message]) -> list[int]:
    """The chat template over `messages` with the generation prompt, as `ChatFormat.prompt_ids`."""
    roles = {"human": "user", "gpt": "assistant"}
    rendered = [{"role": roles[m.role], "content": m.value} for m in messages]
    return chat.template_ids(rendered)
