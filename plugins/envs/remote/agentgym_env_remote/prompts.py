"""AgentGym's instruction prompts and action parsing, written down here (never fetched).

Each AgentGym client opens a conversation with an instruction (a user
message) and a priming assistant reply, then parses the action out of the
model's text, mostly the text after `Action:`. The prompts below are those of
AgentGym's `agentenv` clients for BabyAI, SciWorld, TextCraft and SearchQA.
The priming reply is the engine's own (`Ok.`).
"""

from __future__ import annotations

import re

BABYAI = (
    "You are an exploration master that wants to finish every goal you are given. Every round "
    "I will give you an observation, and you have to respond an action and your thought based "
    "on the observation to finish the given task. You are placed in a room and you need to "
    "accomplish the given goal with actions.\n\nYou can use the following actions: \n\n"
    "- turn right \n\n- turn left \n\n- move forward \n\n- go to <obj> <id> \n\n"
    "- pick up <obj> <id> \n\n- go through <door> <id>: <door> must be an open door. \n\n"
    "- toggle and go through <door> <id>: <door> can be a closed door or a locked door. If you "
    "want to open a locked door, you need to carry a key that is of the same color as the "
    "locked door. \n\n- toggle: there is a closed or locked door right in front of you and you "
    "can toggle it.\nYour response should use the following format:\nThought:\n<Your Thought>"
    "\n\nAction:\n<Your Action>"
)

_SCIWORLD_ACTIONS = [
    ("open/close OBJ", "open/close a container"),
    ("de/activate OBJ", "activate/deactivate a device"),
    ("connect OBJ to OBJ", "connect electrical components"),
    ("disconnect OBJ", "disconnect electrical components"),
    ("use OBJ [on OBJ]", "use a device/item"),
    ("look around", "describe the current room"),
    ("look at OBJ", "describe an object in detail"),
    ("look in OBJ", "describe a container's contents"),
    ("read OBJ", "read a note or book"),
    ("move OBJ to OBJ", "move an object to a container"),
    ("pick up OBJ", "move an object to the inventory"),
    ("put down OBJ", "drop an inventory item"),
    ("pour OBJ into OBJ", "pour a liquid into a container"),
    ("dunk OBJ into OBJ", "dunk a container into a liquid"),
    ("mix OBJ", "chemically mix a container"),
    ("go to LOC", "move to a new location"),
    ("eat OBJ", "eat a food"),
    ("flush OBJ", "flush a toilet"),
    ("focus on OBJ", "signal intent on a task object"),
    ("wait", "take no action for 10 iterations"),
    ("wait1", "take no action for 1 iteration"),
    ("task", "describe current task"),
    ("inventory", "list your inventory"),
]
SCIWORLD = (
    "You are an agent for science world. Every round I will give you an observation, you have "
    "to respond an action based on the observation to finish the given task. Here are the "
    "actions you may take: ["
    + ", ".join(f'{{"action": "{a}", "description": "{d}"}}' for a, d in _SCIWORLD_ACTIONS)
    + "]\nYour response should use the following format:\nThought:\nyour thoughts.\n\n"
    "Action:\nyour next action"
)

TEXTCRAFT = (
    "You are given few useful crafting recipes to craft items in Minecraft. Crafting commands "
    'are of the format "craft [target object] using [input ingredients]".\nEvery round I will '
    "give you an observation, you have to respond an action based on the state and "
    'instruction. You can "get" an object (ingredients) from the inventory or the environment, '
    'look-up the game inventory by "inventory", or "craft" (target) using any of the crafting '
    'commands.\nYour output must strictly follow this format:"Thought:\nyour thoughts.\n\n'
    'Action:\nyour next action"\n\nReminder: \n1. Always specify the quantity when using "get" '
    'and "craft" commands. - Example of get: get 1 lapis lazuli - Example1 of craft: craft 1 '
    "blue dye using 1 lapis lazuli - Example2 of craft: craft 1 golden carrot using 8 gold "
    'nugget, 1 carrot\n2. When using "get" command, do not specify whether the item comes from '
    "the inventory or the environment.\n3. You can use ONLY crafting commands provided, do not "
    "use your own crafting commands. However, if the crafting command uses a generic ingredient "
    'like "planks", you can use special types of the same ingredient e.g. "dark oak planks" in '
    "the command instead.\n\n"
)

SEARCHQA = (
    "You must always reason inside <think>...</think> first; if you lack knowledge, issue a "
    "<search>...</search> and then stop; do not generate <information> or <answer> yet; wait "
    "for external input between <information>...</information> before continuing; resume only "
    "when new <information> is given; do not skip steps or anticipate answers early."
)

INSTRUCTIONS = {
    "babyai": BABYAI,
    "sciworld": SCIWORLD,
    "textcraft": TEXTCRAFT,
    "searchqa": SEARCHQA,
}
"""Built-in instruction of each env whose AgentGym prompt is written down here."""

TEXTCRAFT_ONE_ACTION = (
    "Error: Only one 'Action' is allowed per response. Please adjust your response."
)
"""What AgentGym's TextCraft client answers, without calling the server, to two actions."""


class ActionRejected(ValueError):
    """The text holds no usable action; `observation` is what the agent is told instead."""

    def __init__(self, observation: str) -> None:
        super().__init__(observation)
        self.observation = observation


def raw_action(text: str) -> str:
    """The whole text, stripped (SearchQA's server parses `<search>`/`<answer>` itself)."""
    return text.strip()


def after_action(text: str) -> str:
    """BabyAI/SciWorld/WebShop: the text after the first `Action:`, else the whole text.

    As AgentGym's clients: a trailing `</s>` is dropped and, with several
    `Action:` markers, only the text up to the second one is kept.
    """
    text = text.removesuffix("</s>")
    parts = text.split("Action:")
    return (parts[1] if len(parts) > 1 else parts[0]).strip()


def textcraft_action(text: str) -> str:
    """TextCraft: the one line after `Action:`, letters, digits, commas and spaces only.

    Two `Action:` lines are rejected (`ActionRejected`), `look` reads
    `inventory`. Text with no `Action:` is taken whole: AgentGym's client
    would send an empty action there, which fails every constrained (bare) action.
    """
    matches = re.findall(r"Action:\s*(.*?)(?=\n|$)", text, re.DOTALL)
    if len(matches) > 1:
        raise ActionRejected(TEXTCRAFT_ONE_ACTION)
    action = matches[-1] if matches else text
    action = " ".join(re.sub(r"[^A-Za-z0-9, ]+", "", action).split())
    return "inventory" if action.lower() == "look" else action


AVAILABLE_ACTIONS = re.compile(r"Available actions:\s*(\[.*?\])\s*$", re.DOTALL)


def listed_actions(observation: str) -> list[str] | None:
    """The JSON list of BabyAI's `Available actions: [...]` closing line, if there is one."""
    import json

    match = AVAILABLE_ACTIONS.search(observation)
    if match is None:
        return None
    try:
        actions = json.loads(match.group(1))
    except json.JSONDecodeError:
        return None
    if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
        return None
    return actions or None
