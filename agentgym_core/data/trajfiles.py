"""Convert between AgentTraj / AgentEval JSON and this library's trajectory JSONL.

Trajectory JSONL is what the MLflow tracker writes: one `Trajectory.to_dict()`
per line, without the token fields, readable by `Trajectory.from_dict`.

`import_agenttraj` (AgentTraj -> JSONL) keeps everything the JSON held: an
item becomes a trajectory whose turns are its (action, next observation)
pairs; what a turn cannot hold (the opening messages before the first
trained action, a `loss` flag or message key off the usual pattern, the item
id when it is not `<task_group>_<task_id>`, extra item keys) goes under
`info["agenttraj"]` of the first or that turn. Exporting the result gives the
same JSON back.

`export_agenttraj` (JSONL -> AgentTraj) writes each trajectory as a
conversation. Lines the tracker wrote hold no opening prompt; it is rebuilt
from the environment (`instruction()` and `reset(task_id)`, both
deterministic), so pass the env. The fields AgentTraj has no place for
(rewards, success, termination, turn infos, the last observation) ride along
as one JSON string under the item key `agentgym`, so importing the export
gives the trajectories back; `plain=True` leaves it out.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agentgym_core.data.agenttraj import (
    AgentTrajError,
    episode_messages,
    parse_conversation,
    task_number,
)
from agentgym_core.tracking.mlflow_tracker import TOKEN_FIELDS
from agentgym_core.types import Termination, Trajectory, Turn

META_KEY = "agentgym"
"""Item key of the JSON string holding what AgentTraj has no field for."""
INFO_KEY = "agenttraj"
"""Turn `info` key holding what a trajectory has no field for."""
ACTION_SHAPE = {"from": "gpt", "loss": True}
OBSERVATION_SHAPE = {"from": "human", "loss": None}


# -- AgentTraj -> trajectories -----------------------------------------------------------------


def split_item_id(item_id: str) -> tuple[str, int]:
    """`babyai_12` -> (`babyai`, 12); an id not ending in `_<int>` -> (the id, -1)."""
    number = task_number(item_id)
    if number is None:
        return item_id, -1
    return item_id[: -len(f"_{number}")] or item_id, number


def item_to_trajectory(raw: dict[str, Any], index: int, source: str = "<data>") -> Trajectory:
    """One AgentTraj (or AgentEval) item as a trajectory; `index` becomes its group."""
    item_id = raw.get("item_id")
    if not isinstance(item_id, str) or not item_id:
        raise AgentTrajError(
            source, index, "item_id", f"expected a non-empty string, got {item_id!r}"
        )
    prefix, task_id = split_item_id(item_id)
    trajectory = Trajectory(task_id=task_id, group=index, task_group=prefix)
    if "conversations" not in raw:  # AgentEval: the task only
        return trajectory
    parse_conversation(raw["conversations"], source, index, "conversations")  # validates
    messages: list[dict[str, Any]] = raw["conversations"]
    first = next(
        (i for i, m in enumerate(messages) if m["from"] == "gpt" and m.get("loss") is not False),
        len(messages),
    )
    opening: dict[str, Any] = {"prompt": messages[:first]}
    extra = {k: v for k, v in raw.items() if k not in ("item_id", "conversations", META_KEY)}
    if extra:
        opening["extra"] = extra
    trajectory.turns = _turns(messages[first:]) or [Turn("", "", 0.0, info={})]
    if first == len(messages):
        opening["prompt_only"] = True
    trajectory.turns[0].info[INFO_KEY] = {**opening, **trajectory.turns[0].info.get(INFO_KEY, {})}
    if META_KEY in raw:
        _apply_meta(trajectory, raw[META_KEY], source, index)
    if item_id != f"{trajectory.task_group}_{trajectory.task_id}":
        trajectory.turns[0].info[INFO_KEY]["item_id"] = item_id
    return trajectory


def _shape(message: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k != "value"}


def _turns(messages: list[dict[str, Any]]) -> list[Turn]:
    """Alternating gpt/human messages as turns: each action with the observation after it."""
    turns = []
    for position in range(0, len(messages), 2):
        action, after = messages[position], messages[position + 1 : position + 2]
        notes: dict[str, Any] = {}
        if _shape(action) != ACTION_SHAPE:
            notes["action"] = _shape(action)
        if not after:
            notes["no_observation"] = True
        elif _shape(after[0]) != OBSERVATION_SHAPE:
            notes["observation"] = _shape(after[0])
        observation = after[0]["value"] if after else ""
        turns.append(
            Turn(action["value"], observation, 0.0, info={INFO_KEY: notes} if notes else {})
        )
    return turns


def _apply_meta(trajectory: Trajectory, text: Any, source: str, index: int) -> None:
    """Restore what `export_agenttraj` put under `agentgym`."""
    try:
        meta = json.loads(text) if isinstance(text, str) else None
        assert isinstance(meta, dict)
        turns = meta.pop("turns")
        assert isinstance(turns, list) and len(turns) == len(trajectory.turns)
    except (ValueError, AssertionError, KeyError) as error:
        raise AgentTrajError(
            source, index, META_KEY, f"expected the JSON string export wrote ({error!r})"
        ) from None
    meta["termination"] = Termination(meta.get("termination", "done"))
    for key, value in meta.items():
        setattr(trajectory, key, value)
    for turn, saved in zip(trajectory.turns, turns, strict=True):
        notes = turn.info.get(INFO_KEY)
        turn.reward, turn.done, turn.info = saved["reward"], saved["done"], dict(saved["info"])
        if "observation" in saved:
            turn.observation = saved["observation"]
        if notes:
            turn.info[INFO_KEY] = notes


def read_agenttraj(path: str | Path) -> list[Trajectory]:
    """Trajectories of an AgentTraj or AgentEval file (errors name item and field)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise AgentTrajError(str(path), None, "", f"not valid JSON: {error}") from None
    if not isinstance(data, list):
        raise AgentTrajError(str(path), None, "", "expected a JSON list of items")
    for index, raw in enumerate(data):
        if not isinstance(raw, dict):
            raise AgentTrajError(
                str(path), index, "", f"expected an object, got {type(raw).__name__}"
            )
    return [item_to_trajectory(raw, i, str(path)) for i, raw in enumerate(data)]


# -- trajectories -> AgentTraj -----------------------------------------------------------------


def trajectory_to_item(
    trajectory: Trajectory,
    *,
    env_name: str | None = None,
    opening: tuple[str, str] | None = None,
    plain: bool = False,
) -> dict[str, Any]:
    """One trajectory as an AgentTraj item.

    Args:
        trajectory: the episode.
        env_name: the item id prefix (`<env_name>_<task_id>`); None: its task group.
        opening: (instruction, first observation) for trajectories that do not hold
            their opening messages (those the tracker wrote).
        plain: leave out the `agentgym` key (rewards, termination, turn infos).
    """
    notes = trajectory.turns[0].info.get(INFO_KEY, {}) if trajectory.turns else {}
    item_id = notes.get("item_id") or _item_id(trajectory, env_name)
    if not trajectory.turns:
        return {"item_id": item_id}
    last = len(trajectory.turns) - 1
    if "prompt" in notes:
        messages = [dict(m) for m in notes["prompt"]]
        if not notes.get("prompt_only"):
            messages += _turn_messages(trajectory.turns)
        omitted = {
            i
            for i, t in enumerate(trajectory.turns)
            if t.info.get(INFO_KEY, {}).get("no_observation")
        }
    elif opening is not None:
        messages = [m.to_dict() for m in episode_messages(*opening, trajectory.turns)]
        omitted = {last}  # `episode_messages` leaves out the observation after the last action
    else:
        raise ValueError(
            f"trajectory of task {trajectory.task_id} (group {trajectory.group}) holds no "
            "opening prompt (the tracker does not store it): pass the env so that "
            "instruction() and reset(task_id) rebuild it"
        )
    item = {"item_id": item_id, "conversations": messages, **notes.get("extra", {})}
    meta = _meta(trajectory, omitted)
    # Only what a plain import of the item would not give back: an imported file stays as it was.
    if not plain and meta != _meta(item_to_trajectory(item, trajectory.group), omitted):
        item[META_KEY] = json.dumps(meta, ensure_ascii=False)
    return item


def _item_id(trajectory: Trajectory, env_name: str | None) -> str:
    if trajectory.task_id < 0 and env_name is None:
        return trajectory.task_group
    return f"{env_name or trajectory.task_group}_{trajectory.task_id}"


def _turn_messages(turns: list[Turn]) -> list[dict[str, Any]]:
    messages = []
    for turn in turns:
        notes = turn.info.get(INFO_KEY, {})
        messages.append({**notes.get("action", ACTION_SHAPE), "value": turn.action})
        if not notes.get("no_observation"):
            messages.append(
                {**notes.get("observation", OBSERVATION_SHAPE), "value": turn.observation}
            )
    return messages


def _meta(trajectory: Trajectory, omitted: set[int]) -> dict[str, Any]:
    """Trajectory fields AgentTraj cannot hold, and the observations its messages leave out."""
    turns = []
    for position, turn in enumerate(trajectory.turns):
        info = {k: v for k, v in turn.info.items() if k != INFO_KEY}
        saved: dict[str, Any] = {"reward": turn.reward, "done": turn.done, "info": info}
        if position in omitted:
            saved["observation"] = turn.observation
        turns.append(saved)
    data = trajectory.to_dict()
    per_token = (*TOKEN_FIELDS, "ref_logprobs", "values", "behaviour_logprobs")
    for key in per_token:  # per-token lists: not for files
        data.pop(key, None)
    data["turns"] = turns
    return data


# -- files -------------------------------------------------------------------------------------


def read_jsonl(path: str | Path) -> list[Trajectory]:
    """Trajectories of a JSONL file (the tracker's format); errors name the line."""
    trajectories = []
    with Path(path).open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                trajectories.append(Trajectory.from_dict(json.loads(line)))
            except (ValueError, TypeError, KeyError) as error:
                raise ValueError(f"{path}:{number}: not a trajectory line: {error}") from error
    return trajectories


def write_jsonl(trajectories: Iterable[Trajectory], path: str | Path) -> Path:
    """Write trajectories as the tracker does (token fields left out)."""
    from agentgym_core.tracking.mlflow_tracker import jsonl

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(jsonl(trajectories), encoding="utf-8")
    return path


def import_agenttraj(source: str | Path, out: str | Path) -> int:
    """AgentTraj/AgentEval JSON -> trajectory JSONL; returns the number of trajectories."""
    trajectories = read_agenttraj(source)
    write_jsonl(trajectories, out)
    return len(trajectories)


def export_agenttraj(
    source: str | Path,
    out: str | Path,
    *,
    env: Any = None,
    env_name: str | None = None,
    plain: bool = False,
) -> int:
    """Trajectory JSONL -> AgentTraj JSON; `env` rebuilds openings the lines do not hold."""
    items = []
    for trajectory in read_jsonl(source):
        opening = None
        notes = trajectory.turns[0].info.get(INFO_KEY, {}) if trajectory.turns else {}
        if trajectory.turns and "prompt" not in notes and env is not None:
            opening = (env.instruction(), env.reset(trajectory.task_id))
        items.append(
            trajectory_to_item(trajectory, env_name=env_name, opening=opening, plain=plain)
        )
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(items, indent=1, ensure_ascii=False), encoding="utf-8")
    return len(items)


# -- command line ----------------------------------------------------------------------------


def cmd_import(args: argparse.Namespace) -> int:
    """`agentgym data import`."""
    count = import_agenttraj(args.source, args.out)
    print(f"{count} trajectories -> {args.out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """`agentgym data export`."""
    env = None
    if args.env:
        from agentgym_core.env_options import make_env, plugin_host

        env = make_env(plugin_host(), args.env, args.env_option)
    try:
        count = export_agenttraj(
            args.source, args.out, env=env, env_name=args.env, plain=args.plain
        )
    finally:
        if env is not None:
            env.close()
    print(f"{count} items -> {args.out}")
    return 0


def add_commands(data: argparse._SubParsersAction) -> None:
    """Add `import` and `export` to `agentgym data`."""
    imp = data.add_parser("import", help="AgentTraj/AgentEval JSON -> trajectory JSONL")
    imp.add_argument("source", help="AgentTraj or AgentEval JSON file")
    imp.add_argument("--out", required=True, help="trajectory JSONL to write")
    imp.set_defaults(func=cmd_import)
    exp = data.add_parser("export", help="trajectory JSONL -> AgentTraj JSON")
    exp.add_argument("source", help="trajectory JSONL (an import, or the tracker's artifacts)")
    exp.add_argument("--out", required=True, help="AgentTraj JSON to write")
    exp.add_argument(
        "--env",
        help="env that rebuilds the opening prompt (tracker lines lack it); item ids "
        "become <env>_<task>",
    )
    exp.add_argument("-o", "--env-option", action="append", help="env config key=value")
    exp.add_argument(
        "--plain", action="store_true", help="AgentTraj fields only (no `agentgym` metadata)"
    )
    exp.set_defaults(func=cmd_export)
