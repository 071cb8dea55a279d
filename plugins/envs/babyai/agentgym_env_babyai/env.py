"""The `babyai` environment: minigrid's BabyAI levels behind text observations and actions."""

from __future__ import annotations

from typing import Any

from agentgym_core.api import StepResult, seeded_task, seeded_task_ids
from agentgym_env_babyai import render
from agentgym_env_babyai.bot import new_bot
from agentgym_env_babyai.config import BabyAIConfig
from agentgym_env_babyai.world import (
    COLOURS,
    DROP,
    FORWARD,
    LEFT,
    PICKUP,
    RIGHT,
    TOGGLE,
    Thing,
    free_cells_next_to,
    name_objects,
    plan_to_face,
    visible,
)

NOT_RECOGNIZED = "The action is not recognized. Please check valid actions."
CHECK = "check available actions"
INSTRUCTION = """You are an agent in a grid world with a goal. Each turn, answer with one action:
- turn left, turn right, move forward
- go to <obj> <id>: walk next to the object and face it
- pick up <obj> <id>: go to the object and pick it up
- go through <door> <id>: the door must be open
- toggle and go through <door> <id>: open a closed or locked door and go through it
  (a locked door needs the key of its colour)
- toggle: open the door or box right in front of you
- drop: put down what you carry in front of you, or beside the object in front of you
- check available actions"""


def _no_image() -> None:
    """Stands in for minigrid's `gen_obs` (see `BabyAIEnv.reset`)."""
    return None


def _quiet_level_generator() -> None:
    """BabyAI's level generator prints every rejected sample; silence it, thread-safely."""
    from minigrid.envs.babyai.core import roomgrid_level

    roomgrid_level.print = lambda *args, **kwargs: None


class BabyAIEnv:
    """One BabyAI episode at a time; tasks are (level, seed) pairs encoded as integers."""

    def __init__(self, config: BabyAIConfig) -> None:
        _quiet_level_generator()
        self.config = config
        self._games: dict[str, Any] = {}
        self.game: Any = None
        self.things: dict[str, Thing] = {}
        self.done = True
        self.success = False
        self._bot: Any = None
        self._last_primitive: int | None = None
        self._seen: list[Thing] | None = None
        """What the agent sees now (`visible`), until the next primitive step."""

    # -- tasks -------------------------------------------------------------------

    def tasks(self, split: str) -> list[int]:
        """Ids `seed * n_levels + level_index`; test seeds start at 1,000,000."""
        return seeded_task_ids(
            split,
            kinds=len(self.config.levels),
            train_seeds=self.config.train_seeds,
            test_seeds=self.config.test_seeds,
        )

    def task_group(self, task_id: int) -> str:
        """The level name of a task."""
        return self.config.levels[seeded_task(task_id, kinds=len(self.config.levels)).kind]

    def instruction(self) -> str:
        """Rules and action syntax, shown once at the start of each conversation."""
        return self.config.instruction or INSTRUCTION

    # -- episode -------------------------------------------------------------------

    def reset(self, task_id: int) -> str:
        """Generate the level of `task_id` with its seed; returns goal plus first view."""
        import gymnasium as gym

        level = self.task_group(task_id)
        if level not in self._games:
            # unwrapped, and with no image observation: minigrid makes one (the agent's view,
            # encoded) after every primitive step, which the text never reads; with the view
            # asked for three times a turn it was the env's largest cost in a profile of the
            # demo's rollouts. The view is now made once per state (`_visible`)
            game = gym.make(f"BabyAI-{level}-v0").unwrapped
            game.gen_obs = _no_image
            self._games[level] = game
        self.game = self._games[level]
        self.game.reset(seed=seeded_task(task_id, kinds=len(self.config.levels)).seed)
        self.things = name_objects(self.unwrapped)
        self.done, self.success = False, False
        self._bot, self._last_primitive, self._seen = None, None, None
        return self._observe(goal=True)

    @property
    def unwrapped(self) -> Any:
        """The minigrid environment."""
        return self.game.unwrapped

    def _observe(self, *, goal: bool, note: str = "") -> str:
        goal = goal or self.config.repeat_goal
        seen = self._visible()
        actions = self._actions(seen) if self.config.list_actions else None
        return render.observation(self.unwrapped, seen, actions, goal=goal, note=note)

    def valid_actions(self) -> list[str] | None:
        """Every action valid now (objects must be in view)."""
        if self.done:
            return None
        return self._actions(self._visible())

    def _visible(self) -> list[Thing]:
        """What the agent sees, worked out once per state (observation, actions, step share it)."""
        if self._seen is None:
            self._seen = visible(self.unwrapped, self.things)
        return self._seen

    def _actions(self, seen: list[Thing]) -> list[str]:
        env = self.unwrapped
        actions = ["turn left", "turn right", "move forward"]
        for thing in seen:
            actions.append(f"go to {thing.name}")
            if thing.type != "door" and env.carrying is None:
                actions.append(f"pick up {thing.name}")
            if thing.type == "door":
                verb = "go through" if thing.obj.is_open else "toggle and go through"
                actions.append(f"{verb} {thing.name}")
        front = env.grid.get(*env.front_pos)
        if front is not None and front.type in ("door", "box"):
            actions.append("toggle")
        if env.carrying is not None:
            actions.append("drop")
        actions.append(CHECK)
        return actions

    def step(self, action: str) -> StepResult:
        """Run one text action as minigrid primitive steps; rewards add up over them."""
        if self.done:
            return StepResult("The episode is over.", 0.0, True, info={"success": self.success})
        action = " ".join(action.strip().lower().split())
        if action == CHECK:
            return StepResult(self._observe(goal=False), 0.0, False, info={"success": False})
        if action not in self._actions(self._visible()):
            note = NOT_RECOGNIZED
            return StepResult(
                self._observe(goal=False, note=note), 0.0, False, info={"success": False}
            )
        plan = self._plan(action)
        if plan is None:
            note = f"You cannot {action} from here."
            return StepResult(
                self._observe(goal=False, note=note), 0.0, False, info={"success": False}
            )
        return self._execute(plan)

    def _execute(self, plan: list[int]) -> StepResult:
        reward, truncated = 0.0, False
        for primitive in plan or [self.unwrapped.actions.done]:
            _, r, terminated, truncated, _ = self.game.step(primitive)
            self._last_primitive, self._seen = primitive, None
            reward += float(r)
            if terminated or truncated:
                self.done = True
                break
        self.success = self.done and reward > 0
        text = "The task is completed." if self.success else self._observe(goal=False)
        return StepResult(
            text,
            reward,
            self.done,
            truncated=truncated and not self.success,
            info={"success": self.success, "primitive_steps": len(plan)},
        )

    def _plan(self, action: str) -> list[int] | None:
        simple = {"turn left": [LEFT], "turn right": [RIGHT], "move forward": [FORWARD]}
        if action in simple:
            return simple[action]
        if action == "toggle":
            return [TOGGLE]
        if action == "drop":
            return self._plan_drop()
        for verb, tail in (
            ("toggle and go through ", [TOGGLE, FORWARD, FORWARD]),
            ("go through ", [FORWARD, FORWARD]),
            ("pick up ", [PICKUP]),
            ("go to ", []),
        ):
            if action.startswith(verb):
                thing = self.things[action[len(verb) :]]
                path = plan_to_face(self.unwrapped, thing.pos)
                return None if path is None else path + tail
        return None

    def _plan_drop(self) -> list[int] | None:
        env = self.unwrapped
        front = tuple(int(v) for v in env.front_pos)
        if env.grid.get(*front) is None:
            return [DROP]
        best = None
        for cell in free_cells_next_to(env, front):  # the agent's own cell too: it steps away
            path = plan_to_face(env, cell)
            if path is not None and (best is None or len(path) < len(best)):
                best = path
        return None if best is None else best + [DROP]

    # -- expert ----------------------------------------------------------------------

    def expert_action(self) -> str:
        """Next action of minigrid's BabyAIBot, in our vocabulary (one primitive each)."""
        try:
            if self._bot is None:
                self._bot = new_bot(self.game)
                primitive = self._bot.replan()
            else:
                primitive = self._bot.replan(self._last_primitive)
        except AssertionError:  # the bot lost its way; a fresh one plans from here next turn
            self._bot = None
            return "turn left"
        env = self.unwrapped
        if primitive == PICKUP:
            front = env.grid.get(*env.front_pos)
            for thing in self.things.values():
                if thing.obj is front:
                    return f"pick up {thing.name}"
        names = {LEFT: "turn left", RIGHT: "turn right", FORWARD: "move forward"}
        names.update({DROP: "drop", TOGGLE: "toggle"})
        return names.get(int(primitive), "turn left")

    def interchangeable_words(self) -> list[list[str]]:
        """The six colours: relabelled copies of expert episodes (`sft.relabel_copies`)."""
        return [list(COLOURS)]

    def render(self) -> Any:
        """Minigrid's top-down RGB frame (the agent's view highlighted), for `agentgym view`."""
        if self.game is None:
            return None
        return self.unwrapped.get_frame(highlight=True, tile_size=16)

    def close(self) -> None:
        """Close every level's minigrid environment."""
        for game in self._games.values():
            game.close()
        self._games.clear()
