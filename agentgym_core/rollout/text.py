"""Text-level policies (chat APIs) and the episode loop that evaluates them.

A chat API takes messages and returns text: no prompt token ids, no sampled
token ids, no log-probabilities. Such a policy cannot train (the learner needs
the exact sampled tokens and their log-probabilities), but it can be evaluated
on the same tasks, with the same conversation, turn limit and metrics as a
token-level policy, so API models and trained checkpoints share one table.

The conversation is the one `ChatFormat.prompt_ids` renders for token-level
policies: the instruction, the priming reply, the first observation, then
alternating actions and observations. Trajectories carry turns, rewards and
terminations; their token fields stay empty.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from agentgym_core.interfaces import Environment, SamplingParams
from agentgym_core.rollout import contract
from agentgym_core.rollout.chat import PRIMING_REPLY
from agentgym_core.rollout.engine import (
    EpisodeSpec,
    PolicyError,
    RolloutEngine,
    RolloutSettings,
)
from agentgym_core.types import Termination, Trajectory, Turn

Message = Mapping[str, str]
"""One chat message: `{"role": "user" | "assistant" | "system", "content": ...}`."""


class ContextWindowExceeded(Exception):
    """The endpoint refused the conversation as too long: the episode ends `context_budget`."""


@runtime_checkable
class TextPolicy(Protocol):
    """A policy that reads messages and answers text: evaluation only.

    Its class sets `text_level = True`, so the run can tell before building it
    that no model needs loading and that it cannot be trained.
    """

    text_level: ClassVar[bool]

    async def chat(
        self,
        messages: Sequence[Message],
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


class TextRolloutEngine(RolloutEngine):
    """`RolloutEngine` for a `TextPolicy`: the same episodes, messages instead of token ids.

    Environment threads, timeouts, env-error handling and result order are the
    token engine's; only the turn loop differs. `rollout.max_context_tokens`
    does not apply (there is no tokenizer): the endpoint's own window does, and
    a refusal for length ends the episode with `context_budget`.
    """

    def __init__(
        self,
        env_factory: Callable[[], Environment],
        policy: TextPolicy,
        *,
        env_threads: int = 8,
    ) -> None:
        super().__init__(env_factory, policy, chat=None, env_threads=env_threads)  # type: ignore[arg-type]
        self.text_policy = policy

    async def run_async(
        self, episodes: Sequence[EpisodeSpec], settings: RolloutSettings
    ) -> list[Trajectory]:
        """Play every episode; the policy's connections close with the event loop's run."""
        try:
            return await super().run_async(episodes, settings)
        finally:
            await self.text_policy.aclose()

    async def _play(
        self,
        env: Environment,
        spec: EpisodeSpec,
        settings: RolloutSettings,
        traj: Trajectory,
        session: int,
        frames: bool = False,
    ) -> None:
        observation = await self._open(env, spec, settings, traj)
        render = await self._first_frame(env, settings, traj, frames)
        messages = opening_messages(self._instructions[id(env)], observation)
        traj.termination = Termination.HORIZON
        for turn in range(settings.max_turns):
            allowed = None
            if settings.constrained:
                allowed = contract.actions(env, await self._env_call(settings, env.valid_actions))
            params = SamplingParams(
                max_new_tokens=settings.max_new_tokens,
                temperature=settings.temperature,
                greedy=settings.greedy,
                seed=hash((settings.seed, spec.task_id, spec.group, spec.sample, turn)) % (2**62),
            )
            try:
                action = await self.text_policy.chat(messages, params, allowed)
            except ContextWindowExceeded:
                traj.termination = Termination.CONTEXT_BUDGET
                return
            except Exception as error:
                raise PolicyError(f"generation failed: {type(error).__name__}: {error}") from error
            result = contract.step(env, await self._env_call(settings, env.step, action))
            traj.turns.append(
                Turn(
                    action,
                    result.observation,
                    float(result.reward),
                    result.done,
                    dict(result.info),
                    allowed=list(allowed) if allowed is not None else None,
                )
            )
            traj.reward += float(result.reward)
            if render is not None:
                traj.frames.append(await self._frame(settings, render))  # type: ignore[union-attr]
            if result.done or result.truncated:
                traj.success = bool(result.info.get("success", result.reward > 0))
                traj.termination = Termination.DONE
                return
            messages += [
                {"role": "assistant", "content": action},
                {"role": "user", "content": result.observation},
            ]
