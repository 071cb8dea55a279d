"""AgentTraj reading, writing and validation; tokenization with two chat templates."""

from __future__ import annotations

import json

import pytest
from colour_env import ColourEnv

from agentgym_core.data.agenttraj import (
    AgentTrajError,
    AgentTrajItem,
    AgentTrajPair,
    Message,
    episode_messages,
    parse_items,
    read_items,
    read_pairs,
    task_number,
    tokenize,
    write_items,
    write_pairs,
)
from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig
from agentgym_core.rollout.chat import PRIMING_REPLY, ChatFormat
from agentgym_core.rollout.engine import EpisodeSpec, RolloutEngine, RolloutSettings

CONVERSATION = [
    {"from": "human", "loss": None, "value": "Go to the ball of the colour named in the goal."},
    {"from": "gpt", "loss": False, "value": "Ok."},
    {"from": "human", "loss": None, "value": "Your goal: go to the red ball."},
    {"from": "gpt", "loss": True, "value": "go to blue ball"},
    {"from": "human", "loss": None, "value": "You did go to blue ball."},
    {"from": "gpt", "loss": True, "value": "go to red ball"},
]


def _write(tmp_path, data, name="data.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


# -- reading and writing ---------------------------------------------------------------


def test_read_write_round_trip_keeps_flags_and_extra_fields(tmp_path):
    raw = [
        {"item_id": "colour_7", "conversations": CONVERSATION, "reward": 1.0},
        {"item_id": "webshop_x", "conversations": [{"from": "human", "value": "hi"}]},
    ]
    items = read_items(_write(tmp_path, raw))
    assert [m.loss for m in items[0].conversations] == [None, False, None, True, None, True]
    assert items[0].extra == {"reward": 1.0}
    assert (items[0].task_id, items[1].task_id) == (7, None)
    again = read_items(write_items(items, tmp_path / "out" / "copy.json"))
    assert again == items
    written = json.loads((tmp_path / "out" / "copy.json").read_text())
    assert written[0] == raw[0]


def test_pairs_round_trip(tmp_path):
    pair = AgentTrajPair(
        "babyai_3",
        parse_items([{"item_id": "a", "conversations": CONVERSATION}])[0].conversations,
        [Message("human", "q"), Message("gpt", "wrong", True)],
    )
    assert read_pairs(write_pairs([pair], tmp_path / "pairs.json")) == [pair]
    assert pair.task_id == 3


@pytest.mark.parametrize(
    ("data", "where", "what"),
    [
        ({"item_id": "x"}, "data.json", "expected a JSON list of items, got an object"),
        (["text"], "data.json: item 0", "expected an object, got a string"),
        ([{"conversations": CONVERSATION}], "item 0: item_id", "non-empty string"),
        ([{"item_id": "a"}], "item 0: conversations", "missing"),
        ([{"item_id": "a", "conversations": []}], "item 0: conversations", "non-empty list"),
        (
            [
                {"item_id": "a", "conversations": CONVERSATION},
                {
                    "item_id": "b",
                    "conversations": [
                        {"from": "human", "value": "x"},
                        {"from": "bot", "value": "y"},
                    ],
                },
            ],
            "item 1: conversations[1].from",
            "expected 'human' or 'gpt', got 'bot'",
        ),
        (
            [{"item_id": "a", "conversations": [{"from": "gpt", "value": "y"}]}],
            "item 0: conversations[0].from",
            "alternate starting with 'human'",
        ),
        (
            [{"item_id": "a", "conversations": [{"from": "human", "value": 3}]}],
            "item 0: conversations[0].value",
            "expected a string, got int 3",
        ),
        (
            [
                {
                    "item_id": "a",
                    "conversations": [
                        {"from": "human", "value": "x"},
                        {"from": "gpt", "value": "y", "loss": "yes"},
                    ],
                }
            ],
            "item 0: conversations[1].loss",
            "expected true, false or null, got 'yes'",
        ),
    ],
)
def test_errors_name_file_item_and_field(tmp_path, data, where, what):
    path = _write(tmp_path, data)
    with pytest.raises(AgentTrajError) as info:
        read_items(path)
    message = str(info.value)
    assert message.startswith(str(path)) and where in message and what in message, message


def test_pair_errors_name_the_side(tmp_path):
    path = _write(tmp_path, [{"item_id": "a", "chosen": CONVERSATION, "rejected": [{}]}])
    with pytest.raises(AgentTrajError, match=r"item 0: rejected\[0\]\.from"):
        read_pairs(path)


def test_bad_json_and_missing_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('[{"item_id": "a",\n  "conversations": [}]')
    with pytest.raises(AgentTrajError, match=r"broken.json: not valid JSON: line 2 column"):
        read_items(path)
    with pytest.raises(AgentTrajError, match="nope.json: no such file"):
        read_items(tmp_path / "nope.json")


def test_task_number():
    assert task_number("babyai_12") == 12
    assert task_number("sciworld_3_7") == 7
    assert task_number("webshop") is None


def test_loss_field_semantics():
    assert Message("gpt", "a", None).trains and Message("gpt", "a", True).trains
    assert not Message("gpt", "a", False).trains and not Message("human", "a", True).trains


# -- tokenizing (tiny_model runs once per chat template: chatml and llama3) ------------------


def _render(tokenizer, messages):
    roles = {"human": "user", "gpt": "assistant"}
    chat = [{"role": roles[m.role], "content": m.value} for m in messages]
    return tokenizer.apply_chat_template(chat, tokenize=False)


def test_mask_covers_exactly_the_loss_true_turns(tiny_model):
    _, tokenizer = tiny_model
    chat = ChatFormat(tokenizer)
    (item,) = parse_items([{"item_id": "c_1", "conversations": CONVERSATION}])
    ids, mask = tokenize(chat, item.conversations)
    assert len(ids) == len(mask)
    trained = [t for t, m in zip(ids, mask, strict=True) if m]
    assert trained == chat.action_ids("go to blue ball") + chat.action_ids("go to red ball")
    # the whole sequence is the chat template of the conversation (up to a trailing newline)
    rendered = _render(tokenizer, item.conversations)
    decoded = tokenizer.decode(ids)
    assert rendered.startswith(decoded) and len(rendered) - len(decoded) <= 2
    # the priming reply is context: its tokens sit in the unmasked prompt
    prompt = ids[: mask.index(1)]
    assert PRIMING_REPLY in tokenizer.decode(prompt)


def test_absent_loss_trains_every_assistant_turn(tiny_model):
    _, tokenizer = tiny_model
    chat = ChatFormat(tokenizer)
    bare = [{k: v for k, v in turn.items() if k != "loss"} for turn in CONVERSATION]
    (item,) = parse_items([{"item_id": "c_1", "conversations": bare}])
    ids, mask = tokenize(chat, item.conversations)
    trained = [t for t, m in zip(ids, mask, strict=True) if m]
    expected = [chat.action_ids(v) for v in ("Ok.", "go to blue ball", "go to red ball")]
    assert trained == [t for part in expected for t in part]
    rendered = _render(tokenizer, item.conversations)
    assert rendered.startswith(tokenizer.decode(ids))


def test_context_only_turns_and_trailing_observation(tiny_model):
    _, tokenizer = tiny_model
    chat = ChatFormat(tokenizer)
    turns = [dict(t) for t in CONVERSATION]
    turns[3]["loss"] = False  # a wrong action kept as context
    turns.append({"from": "human", "loss": None, "value": "The task is completed."})
    (item,) = parse_items([{"item_id": "c_1", "conversations": turns}])
    ids, mask = tokenize(chat, item.conversations)
    assert [t for t, m in zip(ids, mask, strict=True) if m] == chat.action_ids("go to red ball")
    assert ids[-1] == chat.stop_ids[0]  # the trailing observation adds nothing
    assert "go to blue ball" in tokenizer.decode(ids)


def test_rollouts_tokenize_to_their_own_ids_and_mask(tiny_model):
    """An episode written as AgentTraj re-tokenizes to exactly the rollout's tokens and mask."""
    model, tokenizer = tiny_model
    chat = ChatFormat(tokenizer, model.generation_config)
    policy = HFPolicy(HFPolicyConfig(), model=model, tokenizer=tokenizer)
    engine = RolloutEngine(lambda: ColourEnv(never_done=True), policy, chat)
    episodes = [EpisodeSpec(task, group=task) for task in range(6)]
    try:
        trajectories = engine.run(episodes, RolloutSettings(max_turns=3, seed=5))
    finally:
        engine.close()
    env = ColourEnv()
    for traj in trajectories:
        messages = episode_messages(env.instruction(), env.reset(traj.task_id), traj.turns)
        ids, mask = tokenize(chat, messages)
        assert ids == traj.token_ids
        assert mask == traj.loss_mask
    item = AgentTrajItem("colour_0", messages)
    assert parse_items([item.to_dict()]) == [item]
