"""What the rollout engine's one turn loop keeps with a policy: token ids or chat messages.

The engine plays every episode with one loop (environment calls, contract
checks, horizon, frames, turn records). Policies differ only in what they
read and return, and that difference is a `Dialogue`, one per engine, which
opens a `Conversation` per episode:

- `TokenDialogue`, for a token-level `Policy`: the prompt is the chat template
  applied once (`ChatFormat.prompt_ids`), sampled ids are kept exactly as
  sampled with their log-probabilities and constraints, and each observation
  is appended as the template's delta; `rollout.max_context_tokens` bounds
  the episode.
- `rollout.text.TextDialogue`, for a chat API: the same conversation as a
  list of messages; the endpoint's own context window bounds it.

Either way, a conversation that has no room for the next action (or the next
observation) raises `ContextWindowExceeded`, and the loop ends the episode
with `context_budget`.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Protocol

from agentgym_core.interfaces import Policy, SamplingParams
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.types import Generation, Trajectory


class ContextWindowExceeded(Exception):
    """The conversation has no room for what comes next: the episode ends `context_budget`.

    A chat API raises it when the endpoint refuses the conversation as too long.
    """


@dataclass(frozen=True)
class Reply:
    """The policy's next action."""

    text: str
    generation: Generation | None = None
    """The sampled turn, token in and token out; None from a text-level policy."""

    @property
    def logprob(self) -> float | None:
        """Log-probability of the whole action under the sampler (None: a text-level policy)."""
        return None if self.generation is None else float(sum(self.generation.logprobs))


class Conversation(Protocol):
    """One episode's exchange with the policy, in the order the turn loop drives it."""

    async def generate(self, params: SamplingParams, allowed: Sequence[str] | None) -> Reply:
        """Ask the policy for the next action, limited to `allowed` when given.

        Raises:
            ContextWindowExceeded: the action would not fit.
        """
        ...

    def add_action(self, reply: Reply) -> None:
        """Keep the action in the conversation (before the environment answers it)."""
        ...

    def add_observation(self, observation: str) -> None:
        """Keep the environment's answer, which the next action replies to.

        Raises:
            ContextWindowExceeded: it would leave no room for an action.
        """
        ...


class Dialogue(Protocol):
    """How an engine converses with its policy: one per engine, one conversation per episode."""

    def open(
        self,
        traj: Trajectory,
        session: Hashable,
        instruction: str,
        observation: str,
        *,
        max_context_tokens: int,
        max_new_tokens: int,
    ) -> Conversation:
        """Start an episode's conversation from the instruction and the first observation.

        `session` names the episode to the policy; the limits are the rollout's
        (`rollout.max_context_tokens`, `rollout.max_new_tokens`).
        """
        ...

    async def aclose(self) -> None:
        """Close what belongs to the running event loop; called as `run_async` ends."""
        ...


class TokenDialogue:
    """Token in, token out: what the learner trains on is exactly what was sampled."""

    def __init__(self, policy: Policy, chat: ChatFormat) -> None:
        self.policy = policy
        self.chat = chat

    def open(
        self,
        traj: Trajectory,
        session: Hashable,
        instruction: str,
        observation: str,
        *,
        max_context_tokens: int,
        max_new_tokens: int,
    ) -> TokenConversation:
        """Put the prompt on `traj`; the conversation appends to it from then on."""
        prompt = self.chat.prompt_ids(instruction, observation)
        traj.prompt_length = len(prompt)
        _append(traj, prompt, sampled=False)
        return TokenConversation(self, traj, session, max_context_tokens, max_new_tokens)

    def action_budget(self, max_new_tokens: int, allowed: Sequence[str] | None) -> int:
        """Tokens the next action may take in the trajectory.

        Free text: `max_new_tokens`, plus the end-of-turn token that closes a turn cut
        at that length. Constrained: the longest allowed action, which may be longer.
        """
        if not allowed:
            return max_new_tokens + 1
        return max(max_new_tokens, *(len(self.chat.action_tokens(a)) for a in allowed))

    async def aclose(self) -> None:
        """Nothing to close: the policy outlives the run and its owner closes it."""


class TokenConversation:
    """One episode as token ids on its trajectory, within `max_context_tokens`."""

    def __init__(
        self,
        dialogue: TokenDialogue,
        traj: Trajectory,
        session: Hashable,
        max_context_tokens: int,
        max_new_tokens: int,
    ) -> None:
        self.dialogue = dialogue
        self.traj = traj
        self.session = session
        self.max_context_tokens = max_context_tokens
        self.max_new_tokens = max_new_tokens

    async def generate(self, params: SamplingParams, allowed: Sequence[str] | None) -> Reply:
        """Sample after the whole trajectory so far, if the longest allowed action fits."""
        used = len(self.traj.token_ids)
        budget = self.dialogue.action_budget(self.max_new_tokens, allowed)
        if used + budget > self.max_context_tokens:
            raise ContextWindowExceeded(
                f"{used} tokens and an action of up to {budget} exceed {self.max_context_tokens}"
            )
        generation = await self.dialogue.policy.generate(
            self.traj.token_ids, params, allowed, session=self.session
        )
        return Reply(generation.text, generation)

    def add_action(self, reply: Reply) -> None:
        """Append the sampled ids (loss mask 1), their log-probs and their constraints.

        A turn cut at `max_new_tokens` (not `finished`) is closed with the template's
        end-of-turn token, loss mask 0 (the model did not sample it): the next
        observation's delta starts after an end of turn, and without it the
        observation would read as more of the agent's own text.
        """
        generation = reply.generation
        assert generation is not None  # a token-level policy always returns one
        start = len(self.traj.token_ids)
        _append(self.traj, generation.token_ids, sampled=True, logprobs=generation.logprobs)
        for offset, ids in enumerate(generation.allowed or []):
            if ids is not None:
                self.traj.constraints[start + offset] = tuple(ids)
        if not generation.finished:
            _append(self.traj, self.dialogue.chat.stop_ids[:1], sampled=False)

    def add_observation(self, observation: str) -> None:
        """Append the template's delta for a new user turn, if an action still fits after it."""
        delta = self.dialogue.chat.observation_ids(observation)
        used = len(self.traj.token_ids) + len(delta)
        if used + self.max_new_tokens > self.max_context_tokens:
            raise ContextWindowExceeded(
                f"{used} tokens and an action of {self.max_new_tokens} "
                f"exceed {self.max_context_tokens}"
            )
        _append(self.traj, delta, sampled=False)


def _append(
    traj: Trajectory,
    token_ids: Sequence[int],
    *,
    sampled: bool,
    logprobs: Sequence[float] | None = None,
) -> None:
    """Extend a trajectory's ids, loss mask (1 where `sampled`) and log-probs (0 elsewhere)."""
    traj.token_ids.extend(int(t) for t in token_ids)
    traj.loss_mask.extend([1 if sampled else 0] * len(token_ids))
    traj.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(token_ids))
