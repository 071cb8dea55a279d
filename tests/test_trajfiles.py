"""AgentTraj / AgentEval JSON <-> trajectory JSONL: both round trips lose nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentgym_core.data import trajfiles
from agentgym_core.data.agenttraj import AgentTrajError, read_items
from agentgym_core.data.expert import write_expert_dataset
from agentgym_core.tracking.mlflow_tracker import jsonl
from agentgym_core.types import Termination, Trajectory, Turn

pytest.importorskip("agentgym_env_babyai")

from agentgym_env_babyai import BabyAIConfig, BabyAIEnv  # noqa: E402

ODD_FILE = [
    # old AgentInstruct style: no `loss` keys, and an extra message key
    {
        "item_id": "webshop_6",
        "conversations": [
            {"from": "human", "value": "You are web shopping."},
            {"from": "gpt", "value": "Ok."},
            {"from": "human", "value": "Search for shoes.", "lang": "en"},
            {"from": "gpt", "value": "Thought: go.\nAction: search[shoes]"},
        ],
        "source": "agentinstruct",
    },
    # AgentGym style ending on an observation, one context-only reply mid-way
    {
        "item_id": "alfworld_pick_and_place_12",
        "conversations": [
            {"from": "human", "loss": None, "value": "Interact with a household."},
            {"from": "gpt", "loss": False, "value": "Ok."},
            {"from": "human", "loss": None, "value": "You are in a room."},
            {"from": "gpt", "loss": True, "value": "Action: go to desk 1"},
            {"from": "human", "loss": None, "value": "You see a pen."},
            {"from": "gpt", "loss": False, "value": "Action: look"},
            {"from": "human", "loss": None, "value": "Nothing happens."},
        ],
    },
    {"item_id": "sciworld_3", "conversations": [{"from": "human", "loss": None, "value": "Hi"}]},
    {"item_id": "babyai_40"},  # AgentEval: the task only
    {"item_id": "textcraft"},  # an id with no task number
]


@pytest.fixture(scope="module")
def babyai() -> BabyAIEnv:
    return BabyAIEnv(BabyAIConfig(levels=["GoToObj", "OpenDoor"]))


def _roundtrip(data, tmp_path: Path, name: str = "x") -> tuple[list[Trajectory], list]:
    source = tmp_path / f"{name}.json"
    source.write_text(json.dumps(data))
    assert trajfiles.import_agenttraj(source, tmp_path / f"{name}.jsonl") == len(data)
    assert trajfiles.export_agenttraj(
        tmp_path / f"{name}.jsonl", tmp_path / f"{name}2.json"
    ) == len(data)
    return trajfiles.read_jsonl(tmp_path / f"{name}.jsonl"), json.loads(
        (tmp_path / f"{name}2.json").read_text()
    )


def test_expert_agenttraj_round_trip_is_exact(tmp_path, babyai):
    source = tmp_path / "expert.json"
    write_expert_dataset(babyai, "babyai", [0, 1, 2, 3], source)
    data = json.loads(source.read_text())
    trajectories, back = _roundtrip(data, tmp_path)
    assert back == data
    first, conversation = trajectories[0], data[0]["conversations"]
    assert (first.task_id, first.task_group, first.group) == (0, "babyai", 0)
    actions = [m["value"] for m in conversation if m["loss"] is True]
    assert [t.action for t in first.turns] == actions
    # each turn holds the observation that answered its action
    assert first.turns[0].observation == conversation[4]["value"]
    assert first.turns[0].info["agenttraj"]["prompt"] == conversation[:3]


def test_odd_agenttraj_and_agenteval_round_trip_is_exact(tmp_path):
    trajectories, back = _roundtrip(ODD_FILE, tmp_path)
    assert back == ODD_FILE
    webshop, alfworld, sciworld, eval_item, no_number = trajectories
    # no `loss` keys: every gpt message trains, so "Ok." is the first action (as SFT reads it)
    assert [t.action for t in webshop.turns][0] == "Ok."
    assert [t.action for t in alfworld.turns] == ["Action: go to desk 1", "Action: look"]
    assert alfworld.task_group == "alfworld_pick_and_place" and alfworld.task_id == 12
    assert sciworld.turns[0].info["agenttraj"]["prompt_only"] is True
    assert (eval_item.task_id, eval_item.turns) == (40, [])
    assert (no_number.task_id, no_number.task_group) == (-1, "textcraft")


def _tracked(env: BabyAIEnv, task: int, group: int) -> Trajectory:
    """An episode as the engine records it (expert actions), tokens left out."""
    env.reset(task)
    trajectory = Trajectory(task_id=task, group=group, task_group=env.task_group(task))
    for _ in range(2):  # cut at 2 turns: a horizon, not done
        action = env.expert_action()
        result = env.step(action)
        trajectory.turns.append(
            Turn(action, result.observation, result.reward, result.done, dict(result.info))
        )
        trajectory.reward += result.reward
        if result.done:
            break
    trajectory.termination = Termination.DONE if result.done else Termination.HORIZON
    trajectory.success = bool(result.info["success"])
    trajectory.prompt_length = 57
    return trajectory


def test_tracker_jsonl_round_trip_keeps_every_field(tmp_path, babyai):
    tracked = [_tracked(babyai, task, group) for group, task in enumerate([0, 1, 5])]
    tracked.append(Trajectory(task_id=7, group=3, error="boom", termination=Termination.ENV_ERROR))
    tracked[-1].turns.append(Turn("turn left", "", 0.0, info={}))
    (tmp_path / "run.jsonl").write_text(jsonl(tracked))

    with pytest.raises(ValueError, match="holds no opening prompt.*pass the env"):
        trajfiles.export_agenttraj(tmp_path / "run.jsonl", tmp_path / "no.json")

    trajfiles.export_agenttraj(
        tmp_path / "run.jsonl", tmp_path / "run.json", env=babyai, env_name="babyai"
    )
    items = json.loads((tmp_path / "run.json").read_text())
    assert [i["item_id"] for i in items] == ["babyai_0", "babyai_1", "babyai_5", "babyai_7"]
    conversation = items[1]["conversations"]
    assert conversation[0]["value"] == babyai.instruction()
    assert conversation[2]["value"] == babyai.reset(1)
    assert [m["value"] for m in conversation if m["loss"]] == [t.action for t in tracked[1].turns]

    trajfiles.import_agenttraj(tmp_path / "run.json", tmp_path / "back.jsonl")
    back = trajfiles.read_jsonl(tmp_path / "back.jsonl")
    for original, restored in zip(tracked, back, strict=True):
        notes = restored.turns[0].info.pop("agenttraj")
        assert notes["prompt"] == items[original.group]["conversations"][:3]
        for turn in restored.turns[1:]:
            turn.info.pop("agenttraj", None)
        assert restored.to_dict() == Trajectory.from_dict(json.loads(jsonl([original]))).to_dict()

    # ...and exporting the import again gives the same file, env or not
    trajfiles.export_agenttraj(tmp_path / "back.jsonl", tmp_path / "again.json")
    assert json.loads((tmp_path / "again.json").read_text()) == items


def test_plain_export_is_agenttraj_that_sft_reads(tmp_path, babyai):
    (tmp_path / "run.jsonl").write_text(jsonl([_tracked(babyai, 0, 0)]))
    trajfiles.export_agenttraj(
        tmp_path / "run.jsonl", tmp_path / "plain.json", env=babyai, env_name="babyai", plain=True
    )
    items = read_items(tmp_path / "plain.json")
    assert items[0].item_id == "babyai_0" and items[0].extra == {}
    assert [m.role for m in items[0].conversations][:3] == ["human", "gpt", "human"]


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"item_id": "x_1"}, "expected a JSON list"),
        ([{"conversations": []}], "item 0: item_id"),
        ([{"item_id": "x_1", "conversations": [{"from": "bot", "value": "?"}]}], "from"),
        ([{"item_id": "x_1", "conversations": [{"from": "human", "value": 3}]}], "value"),
        (
            [
                {
                    "item_id": "x_1",
                    "conversations": [{"from": "human", "value": "a"}],
                    "agentgym": "{",
                }
            ],
            "item 0: agentgym",
        ),
    ],
)
def test_bad_files_name_item_and_field(tmp_path, data, where):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AgentTrajError, match=where):
        trajfiles.read_agenttraj(path)


def test_cli_import_and_export(tmp_path, babyai):
    from agentgym_core.cli import main

    source = tmp_path / "odd.json"
    source.write_text(json.dumps(ODD_FILE))
    assert main(["data", "import", str(source), "--out", str(tmp_path / "t.jsonl")]) == 0
    assert (
        main(["data", "export", str(tmp_path / "t.jsonl"), "--out", str(tmp_path / "b.json")]) == 0
    )
    assert json.loads((tmp_path / "b.json").read_text()) == ODD_FILE
