"""`agentgym env play NAME`: a person plays an installed environment in the terminal.

Useful to see exactly what an agent sees (the instruction, each observation,
the valid actions) and to check that a task is solvable as rendered. Lines
read from stdin are actions, except the session commands below, so a session
can also be scripted by piping actions in, one per line.

Every value the env returns is checked by `rollout.contract`, as in training:
a wrong type ends the session with the contract's one-line error (the env,
the method, the value and the fix), not a traceback or `Observation: None`.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any, TextIO

from agentgym_core.rollout import contract

SESSION_HELP = """Type an action and press Enter. Session commands:
  help            this help
  actions         list the valid actions again (where the environment enumerates them)
  <number>        take the valid action with that number (where the actions are listed;
                  elsewhere a number is an action like any other)
  =<text>         take <text> exactly as typed, e.g. `=42` for the action "42"
  restart         start the same task again
  quit            leave (end of input does the same)"""
QUIT = ("quit", "exit", "q")


@dataclass
class PlayResult:
    """How the session ended."""

    task_id: int
    turns: int = 0
    reward: float = 0.0
    done: bool = False
    success: bool = False
    quit: bool = False


class Session:
    """One terminal session on one task: prints to `out`, reads actions from `inp`."""

    def __init__(self, env: Any, task_id: int, inp: TextIO, out: TextIO, max_turns: int | None):
        self.env, self.task_id, self.inp, self.out = env, task_id, inp, out
        self.max_turns = max_turns
        self.result = PlayResult(task_id)

    def say(self, text: str = "") -> None:
        """Print a line and flush (a pipe must see the prompt before the next read)."""
        print(text, file=self.out, flush=True)

    def start(self) -> None:
        """Reset the task and show the instruction and first observation."""
        self.result = PlayResult(self.task_id)
        env, task = self.env, self.task_id
        observation = contract.text(env, "reset", env.reset(task), task=task)
        group = contract.text(env, "task_group", env.task_group(task), optional=True, task=task)
        instruction = contract.text(env, "instruction", env.instruction(), optional=True, task=task)
        self.say(f"== task {self.task_id}" + (f" ({group})" if group else "") + " ==")
        self.say("Instruction:")
        self.say("(none)" if instruction is None else instruction)
        self.say()
        self.say("Observation:")
        self.say(observation)
        self.show_actions()

    def show_actions(self) -> None:
        """Numbered valid actions, or a note that the action set is open."""
        actions = self.valid_actions()
        if actions is None:
            self.say("(this environment does not list its actions: type any action)")
            return
        self.say("Valid actions:")
        for number, action in enumerate(actions, start=1):
            self.say(f"  {number:>2}. {action}")

    def valid_actions(self) -> list[str] | None:
        """The env's valid actions now, checked."""
        return contract.actions(self.env, self.env.valid_actions(), task=self.task_id)

    def read(self) -> str | None:
        """The next non-empty input line, or None at end of input (or Ctrl-C)."""
        while True:
            self.out.write("> ")
            self.out.flush()
            try:
                line = self.inp.readline()
            except KeyboardInterrupt:  # Ctrl-C at the prompt quits like `quit`
                line = ""
            if not line:
                self.say()
                return None
            if line.strip():
                return line.strip()

    def resolve(self, line: str) -> str | None:
        """An action from `line`: a number picks a listed action; None if the number is wrong.

        `=text` is `text` verbatim, and where the env lists no actions a number is
        an action itself (an answer, a quantity), so numbers can always be typed.
        """
        if line.startswith("="):
            return line[1:].strip() or None
        if not line.isdigit():
            return line
        actions = self.valid_actions()
        if actions is None:
            return line
        if 1 <= int(line) <= len(actions):
            return actions[int(line) - 1]
        self.say(f"No valid action number {line}: there are {len(actions)}. Type `actions`.")
        return None

    def take(self, action: str) -> bool:
        """Step the environment and report; True when the episode is over."""
        result = contract.step(self.env, self.env.step(action), task=self.task_id)
        self.result.turns += 1
        self.result.reward += float(result.reward)
        self.say(f"Action: {action}")
        self.say("Observation:")
        self.say(result.observation)
        over = result.done or result.truncated
        self.say(
            f"reward {result.reward:g} | total {self.result.reward:g} | done {result.done} "
            f"| turn {self.result.turns}" + (" | truncated" if result.truncated else "")
        )
        if over:
            self.result.done = True
            self.result.success = bool(result.info.get("success", result.reward > 0))
            return True
        if self.max_turns is not None and self.result.turns >= self.max_turns:
            self.say(f"Turn limit {self.max_turns} reached.")
            return True
        self.show_actions()
        return False

    def run(self) -> PlayResult:
        """Play until the episode ends, the turn limit, `quit` or end of input."""
        self.start()
        while True:
            line = self.read()
            if line is None or line.lower() in QUIT:
                self.result.quit = True
                break
            command = line.lower()
            if command in ("help", "?"):
                self.say(SESSION_HELP)
            elif command == "actions":
                self.show_actions()
            elif command == "restart":
                self.start()
            else:
                action = self.resolve(line)
                if action is not None and self.take(action):
                    break
        self.summary()
        return self.result

    def summary(self) -> None:
        """One closing line: outcome, turns, total reward."""
        r = self.result
        outcome = "quit" if r.quit else ("success" if r.success else "failure")
        if not r.quit and not r.done:
            outcome = "turn limit"
        self.say(f"== episode over: {outcome} after {r.turns} turns, total reward {r.reward:g} ==")


def pick_task(env: Any, split: str, task_id: int | None) -> int:
    """`task_id` if the env knows it (either split), else the first task of `split`."""
    tasks = list(env.tasks(split))
    if task_id is None:
        if not tasks:
            raise ValueError(f"the {split!r} split has no tasks")
        return tasks[0]
    other = "test" if split == "train" else "train"
    if task_id in tasks or task_id in env.tasks(other):
        return task_id
    raise ValueError(
        f"task {task_id} is in neither split; {split} tasks start {', '.join(map(str, tasks[:5]))}"
    )


def play(
    env: Any,
    task_id: int,
    *,
    inp: TextIO | None = None,
    out: TextIO | None = None,
    max_turns: int | None = None,
) -> PlayResult:
    """Play `task_id` of `env` with actions read from `inp` (stdin); output to `out` (stdout)."""
    session = Session(env, task_id, inp or sys.stdin, out or sys.stdout, max_turns)
    return session.run()


def cmd_env_play(args: argparse.Namespace) -> int:
    """Build the env from its registered config and options, then play one task."""
    from agentgym_core.env_options import make_env, plugin_host

    env = make_env(plugin_host(), args.env, args.env_option)  # bad options: a ConfigError
    try:
        task = pick_task(env, args.split, args.task)
        play(env, task, max_turns=args.max_turns)
    except ValueError as error:
        print(f"agentgym: error: {args.env}: {error}", file=sys.stderr)
        return 2
    finally:
        env.close()
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `env play` to the `agentgym` subcommands."""
    env = sub.add_parser("env", help="environment utilities").add_subparsers(
        dest="action", required=True
    )
    play_cmd = env.add_parser(
        "play",
        help="play an installed environment in the terminal",
        description=SESSION_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    play_cmd.add_argument("env", help="registered environment name (see `agentgym plugins`)")
    play_cmd.add_argument("--task", type=int, help="task id (default: the split's first task)")
    play_cmd.add_argument(
        "--split",
        default="train",
        choices=["train", "test"],
        help="split whose first task is played when --task is not given",
    )
    play_cmd.add_argument("-o", "--env-option", action="append", help="env config key=value")
    play_cmd.add_argument("--max-turns", type=int, help="end the episode after this many turns")
    play_cmd.set_defaults(func=cmd_env_play)
