"""minigrid's BabyAIBot, with a bound on its subgoal stack.

On some layouts the bot never settles: going to a locked door it has no key
for, it pops one subgoal and pushes three (go to the door, pick up the key,
go to the key) in a loop that never returns, and memory grows without end
(AgentGym level 29, train `data_idx` 68, ran for 25 minutes and took 11 GB
before it was stopped). The bound turns that into the AssertionError the bot
raises when it loses its way, which its callers already handle.
"""

from __future__ import annotations

from typing import Any

STACK_LIMIT = 64
"""Subgoals the bot may stack; its real plans stay far below this."""


class SubgoalStack(list):
    """The bot's stack of subgoals; pushing past `STACK_LIMIT` fails like the bot does."""

    def append(self, subgoal: Any) -> None:
        """Push `subgoal`, unless the stack is full."""
        if len(self) >= STACK_LIMIT:
            raise AssertionError(f"BabyAIBot stacked more than {STACK_LIMIT} subgoals")
        super().append(subgoal)


def new_bot(game: Any) -> Any:
    """A BabyAIBot for `game`'s current state whose replanning always returns."""
    from minigrid.utils.baby_ai_bot import BabyAIBot

    bot = BabyAIBot(game)
    bot.stack = SubgoalStack(bot.stack)
    return bot
