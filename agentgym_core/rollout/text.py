"""Text-level policies (chat APIs) and how the rollout engine converses with them.

A chat API takes messages and returns text: no prompt token ids, no sampled
token ids, no log-probabilities. Such a policy cannot train (the learner needs
the exact sampled tokens and their log-probabilities), but it can be evaluated
on the same tasks, with the same conversation, turn limit and metrics as a
token-level policy, so API models and trained checkpoints share one table.

It plays in the rollout engine's one turn loop; only its `Dialogue` differs
(`TextDialogue`, see `rollout.conversation`). The conversation is the one
`ChatFormat.prompt_ids` renders for token-level policies: the instruction, the
priming reply, the first observation, then alternating actions and
observations. Trajectories carry turns, rewards and terminations; their token
fields stay empty and each turn's `logprob` is None.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from agentgym_core.interfaces import Environment, SamplingParams
from agentgym_core.rollout.chat import PRIMING_REPLY
from agentgym_core.rollout.conversation import ContextWindowExceeded, Reply
from agentgym_core.rollout.engine import RolloutEngine
from agentgym_core.types import Trajectory

__all__ = [
    "ChatMessage",
    "ContextWindowExceeded",
    "Message",
    "TextConversation",
    "TextDialogue",
    "TextPolicy",
    "TextRolloutEngine",
    "is_text_level",
    "opening_messages",
]

ChatMessage = Mapping[str, str]
"""One chat API message: `{"role": "user" | "assistant" | "system", "content": ...}`.

Not an AgentTraj turn (`agentgym_core.types.Message`, `human`/`gpt` with a loss flag).
"""
Message = ChatMessage
"""`ChatMessage` under its older name, as `agentgym_core.api` has always lent it."""


@runtime_checkable
class TextPolicy(Protocol):
    """A policy that reads messages and answers text: evaluation only.

    Its class sets `text_level = True`, so the run can tell before building it
    that no model needs loading and that it cannot be trained.
    """

    text_level: ClassVar[bool]

    async def chat(
        self,
        messages: Sequence[ChatMessage],
        params: SamplingParams,
        allowed_actions: Sequence[str] | None = None,
    ) -> str:
        """The assistant's next action as text.

        Raises:
            ContextWindowExceeded: the conversation no longer fits the model.
        """
        ...

    async def aclose(self) -> None:
        """Close what belongs to the running event loop (connections); called as a run ends."""
        ...

    def close(self) -> None:
        """Release what is left (the policy is not used again)."""
        ...


def is_text_level(policy_or_factory: Any) -> bool:
    """True for a text-level policy, its class, or a factory that declares `text_level`."""
    return bool(getattr(policy_or_factory, "text_level", False))


def opening_messages(instruction: str, observation: str) -> list[dict[str, str]]:
    """The messages `ChatFormat.prompt_ids` renders: instruction, priming reply, observation."""
    return [
        {"role": "user", "content": instruction},
        {"role": "assistant", "content": PRIMING_REPLY},
        {"role": "user", "content": observation},
    ]


class TextDialogue:
    """Conversations with a `TextPolicy`: messages in, text out.

    `rollout.max_context_tokens` does not apply (there is no tokenizer): the
    endpoint's own window does, and its refusal for length
    (`ContextWindowExceeded`) ends the episode with `context_budget`.
    """

    def __init__(self, policy: TextPolicy) -> None:
        self.policy = policy

    def open(
        self,
        traj: Trajectory,
        session: Hashable,
        instruction: str,
        observation: str,
        *,
        max_context_tokens: int,
        max_new_tokens: int,
    ) -> TextConversation:
        """The opening messages; the trajectory's token fields stay empty."""
        return TextConversation(self.policy, opening_messages(instruction, observation))

    async def aclose(self) -> None:
        """Close the policy's connections of this event loop."""
        await self.policy.aclose()


class TextConversation:
    """One episode as a growing list of chat messages."""

    def __init__(self, policy: TextPolicy, messages: list[dict[str, str]]) -> None:
        self.policy = policy
        self.messages = messages

    async def generate(self, params: SamplingParams, allowed: Sequence[str] | None) -> Reply:
        """The policy's answer to the conversation so far."""
        return Reply(await self.policy.chat(self.messages, params, allowed))

    def add_action(self, reply: Reply) -> None:
        """The action as an assistant message."""
        self.messages.append({"role": "assistant", "content": reply.text})

    def add_observation(self, observation: str) -> None:
        """The observation as a user message."""
        self.messages.append({"role": "user", "content": observation})


class TextRolloutEngine(RolloutEngine):
    """`RolloutEngine` for a `TextPolicy`: the same episodes and turn loop, over messages.

    Environment threads, timeouts, env-error handling, result order and the
    turn loop are the token engine's; the conversation is a `TextDialogue`,
    and the policy's `aclose` runs as each `run_async` ends.
    """

    def __init__(
        self,
        env_factory: Callable[[], Environment],
        policy: TextPolicy,
        *,
        env_threads: int = 8,
    ) -> None:
        super().__init__(
            env_factory,
            policy,  # type: ignore[arg-type]
            None,
            env_threads=env_threads,
            dialogue=TextDialogue(policy),
        )
        self.text_policy = policy
