"""The asynchronous multi-turn rollout engine.

One asyncio task per episode. Environment calls run on daemon threads, a
bounded number at once, each with a timeout (one that never returns is left
behind, never waited for); generation requests go to the policy, which
batches whatever is pending. An episode waiting on its environment never
holds back another that could be generating: there is no per-turn barrier.

The turn loop (`_play`) is the only one, for token-level policies and chat
APIs alike: what it keeps with the policy, token ids or messages, is the
engine's `Dialogue` (see `rollout.conversation`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym_core.interfaces import Environment, Policy, SamplingParams
from agentgym_core.rollout import contract
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.rollout.conversation import (
    ContextWindowExceeded,
    Conversation,
    Dialogue,
    Reply,
    TokenDialogue,
)
from agentgym_core.rollout.frames import encode_frame
from agentgym_core.rollout.threads import DaemonThreads, EnvThreads, error_trace
from agentgym_core.types import Termination, Trajectory, Turn, round_robin


class PolicyError(RuntimeError):
    """Generation failed. Not an environment fault, so it stops the run instead of one episode."""


class EnvironmentDown(RuntimeError):
    """The environment stayed down longer than `rollout.env_recovery_s`.

    An update or evaluation during an outage measures or trains on nothing;
    without this a dead env server would let a run "finish" having learned nothing.
    """


@dataclass(frozen=True)
class RolloutSettings:
    """How episodes are played."""

    max_turns: int
    max_context_tokens: int = 2048
    max_new_tokens: int = 32
    temperature: float = 1.0
    greedy: bool = False
    constrained: bool = True
    env_timeout_s: float = 30.0
    concurrency: int = 64
    seed: int = 0
    frames: int = 0
    """Episodes of a run() that record the env's render() after reset and every step."""


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to play: a task, its group (for group-relative advantages) and a sample index."""

    task_id: int
    group: int
    sample: int = 0


CLOSE_GRACE_S = 5.0
"""At the end of a run, how long env calls still running (not yet late) may take to return."""
OUT_CLOSE_S = 5.0
"""At the end of a run, how long closing one instance stopped mid-episode may take."""


def _close_quietly(env: Environment) -> None:
    with contextlib.suppress(Exception):  # already failing; closing is best effort
        env.close()


class EnvPool:
    """Reusable environment instances; a broken one is closed and replaced.

    The pool also knows the instances out on an episode, so that a run
    stopped mid-episode (SIGTERM, Ctrl-C, an error elsewhere) closes those
    too: an env that owns a process (a browser, a server) leaves none behind.
    """

    def __init__(self, factory: Callable[[], Environment]) -> None:
        self._factory = factory
        self._idle: list[Environment] = []
        self._out: dict[int, Environment] = {}
        """id(env) -> env, for instances acquired and neither released nor dropped."""
        self.created = 0

    def acquire(self) -> Environment:
        """An idle instance, or a new one."""
        if self._idle:
            env = self._idle.pop()
        else:
            self.created += 1
            env = self._factory()
        self._out[id(env)] = env
        return env

    def release(self, env: Environment) -> None:
        """Return a healthy instance for reuse."""
        self._out.pop(id(env), None)
        self._idle.append(env)

    def drop(self, env: Environment) -> None:
        """Forget a broken instance; whoever dropped it closes it."""
        self._out.pop(id(env), None)

    def counters(self) -> dict[str, float]:
        """An instance's `counters()`, prefixed `env/` (empty when there is none).

        `counters()` is an optional Environment method: cumulative numbers the
        env keeps across instances, such as the remote env's per-server counts.
        """
        for env in [*self._idle, *self._out.values()]:
            counters = getattr(env, "counters", None)
            if callable(counters):
                return {f"env/{key}": float(value) for key, value in counters().items()}
            return {}
        return {}

    def close(self, out_timeout_s: float = OUT_CLOSE_S) -> None:
        """Close every instance; the first failure is raised after all were tried.

        Idle instances close here; those still out on an episode close on
        daemon threads, all together given `out_timeout_s` (one may be hung in
        a call, and its close with it).
        """
        errors = []
        while self._idle:
            try:
                self._idle.pop().close()
            except Exception as error:  # noqa: BLE001 - re-raised below, after the others
                errors.append(error)
        out, self._out = list(self._out.values()), {}
        if out:
            closer = DaemonThreads("env-close")
            closing = [closer.submit(_close_quietly, env) for env in out]
            concurrent.futures.wait(closing, timeout=out_timeout_s)
            closer.shutdown()
        if errors:
            raise errors[0]


class RolloutEngine:
    """Plays episodes concurrently and turns them into trajectories.

    A token-level `policy` converses through `chat` (a `TokenDialogue`); any
    other kind of policy comes with its own `dialogue` (a chat API's is
    `rollout.text.TextDialogue`) and no `chat`.
    """

    def __init__(
        self,
        env_factory: Callable[[], Environment],
        policy: Policy,
        chat: ChatFormat | None,
        *,
        env_threads: int = 8,
        dialogue: Dialogue | None = None,
    ) -> None:
        self.env_factory = env_factory
        self.pool = EnvPool(env_factory)
        self.policy = policy
        self.chat = chat
        if dialogue is None:
            if chat is None:
                raise ValueError("a token-level policy needs a ChatFormat (or pass a dialogue)")
            dialogue = TokenDialogue(policy, chat)
        self.dialogue = dialogue
        self.threads = EnvThreads(env_threads)
        self._instructions: dict[int, str] = {}
        """Keyed by id(env), for live instances only (dropped when an instance is)."""
        self._sessions = itertools.count()
        self.generate_seconds = 0.0

    @property
    def env_seconds(self) -> float:
        """Total time spent in environment calls."""
        return self.threads.seconds

    def close(self) -> None:
        """Close threads, then environments, those stopped mid-episode included.

        Env calls still running get `CLOSE_GRACE_S` to return first, so an
        instance caught starting its browser is whole when it is closed.
        """
        try:
            self.threads.shutdown(grace_s=CLOSE_GRACE_S)
        finally:
            self.pool.close()

    def run(
        self,
        episodes: Sequence[EpisodeSpec],
        settings: RolloutSettings,
        on_done: Callable[[Trajectory], None] | None = None,
        on_turn: Callable[[], None] | None = None,
    ) -> list[Trajectory]:
        """Play every episode; returns trajectories in the order of `episodes`.

        `on_done(trajectory)` is called as each episode ends and `on_turn()` after each
        env step of any episode (progress lines, even while every episode is mid-way).
        """
        return asyncio.run(self.run_async(episodes, settings, on_done, on_turn))

    async def run_async(
        self,
        episodes: Sequence[EpisodeSpec],
        settings: RolloutSettings,
        on_done: Callable[[Trajectory], None] | None = None,
        on_turn: Callable[[], None] | None = None,
    ) -> list[Trajectory]:
        """Async form of `run`, for callers that already own an event loop.

        The dialogue's `aclose` runs as it ends (a chat API's connections belong
        to this event loop).
        """
        slots = asyncio.Semaphore(settings.concurrency)

        framed = set(round_robin(list(episodes), settings.frames))

        async def bounded(spec: EpisodeSpec) -> Trajectory:
            async with slots:
                trajectory = await self._episode(spec, settings, spec in framed, on_turn)
            if on_done is not None:
                on_done(trajectory)
            return trajectory

        try:
            return list(await asyncio.gather(*(bounded(spec) for spec in episodes)))
        finally:
            await self.dialogue.aclose()

    async def _env_call(self, settings: RolloutSettings, fn: Callable[..., Any], *args: Any) -> Any:
        return await self.threads.call(settings.env_timeout_s, fn, *args)

    async def _episode(
        self,
        spec: EpisodeSpec,
        settings: RolloutSettings,
        frames: bool = False,
        on_turn: Callable[[], None] | None = None,
    ) -> Trajectory:
        trajectory = Trajectory(task_id=spec.task_id, group=spec.group)
        env = self.pool.acquire()
        session = next(self._sessions)
        try:
            await self._play(env, spec, settings, trajectory, session, frames, on_turn)
        except (PolicyError, contract.EnvironmentContractError):  # stop the run, not one episode
            await self._discard(env, settings, None)
            raise
        except Exception as error:  # noqa: BLE001 - infrastructure failure, recorded not raised
            trajectory.termination = Termination.ENV_ERROR
            trajectory.error = f"{type(error).__name__}: {error}"
            trajectory.error_trace = error_trace(error)
            await self._discard(env, settings, getattr(error, "pending", None))
        else:
            self.pool.release(env)
        finally:
            release = getattr(self.policy, "release", None)
            if release is not None:
                release(session)
        return trajectory

    async def _discard(
        self,
        env: Environment,
        settings: RolloutSettings,
        pending: concurrent.futures.Future | None,
    ) -> None:
        """Close a broken instance off the event loop; a hung one once its call returns."""
        self._instructions.pop(id(env), None)
        self.pool.drop(env)
        if pending is not None and not pending.done():
            pending.add_done_callback(lambda _: _close_quietly(env))
            return
        with contextlib.suppress(Exception):
            await self._env_call(settings, _close_quietly, env)

    async def _open(
        self, env: Environment, spec: EpisodeSpec, settings: RolloutSettings, traj: Trajectory
    ) -> str:
        """Reset `env` to the task; its first observation (instruction and group kept too)."""
        observation = await self._env_call(settings, env.reset, spec.task_id)
        observation = contract.text(env, "reset", observation)
        if id(env) not in self._instructions:
            instruction = await self._env_call(settings, env.instruction)
            self._instructions[id(env)] = contract.text(
                env, "instruction", instruction, optional=True
            )
        group = await self._env_call(settings, env.task_group, spec.task_id)
        traj.task_group = contract.text(env, "task_group", group, optional=True)
        traj.first_observation = observation
        return observation

    async def _play(
        self,
        env: Environment,
        spec: EpisodeSpec,
        settings: RolloutSettings,
        traj: Trajectory,
        session: int,
        frames: bool = False,
        on_turn: Callable[[], None] | None = None,
    ) -> None:
        observation = await self._open(env, spec, settings, traj)
        render = await self._first_frame(env, settings, traj, frames)
        conversation = self.dialogue.open(
            traj,
            session,
            self._instructions[id(env)],
            observation,
            max_context_tokens=settings.max_context_tokens,
            max_new_tokens=settings.max_new_tokens,
        )
        traj.termination = Termination.HORIZON
        for turn in range(settings.max_turns):
            allowed = None
            if settings.constrained:
                allowed = contract.actions(env, await self._env_call(settings, env.valid_actions))
            try:
                reply = await self._generate(conversation, _params(settings, spec, turn), allowed)
            except ContextWindowExceeded:
                traj.termination = Termination.CONTEXT_BUDGET
                return
            conversation.add_action(reply)
            result = contract.step(env, await self._env_call(settings, env.step, reply.text))
            traj.turns.append(
                Turn(
                    reply.text,
                    result.observation,
                    float(result.reward),
                    result.done,
                    dict(result.info),
                    allowed=list(allowed) if allowed is not None else None,
                    logprob=reply.logprob,
                )
            )
            traj.reward += float(result.reward)
            if on_turn is not None:
                on_turn()
            if render is not None:
                traj.frames.append(await self._frame(settings, render))  # type: ignore[union-attr]
            if result.done or result.truncated:
                traj.success = bool(result.info.get("success", result.reward > 0))
                traj.termination = Termination.DONE
                return
            if turn + 1 == settings.max_turns:
                return  # horizon: no observation after the last action the agent may take
            try:
                conversation.add_observation(result.observation)
            except ContextWindowExceeded:
                traj.termination = Termination.CONTEXT_BUDGET
                return

    async def _generate(
        self, conversation: Conversation, params: SamplingParams, allowed: Sequence[str] | None
    ) -> Reply:
        """The policy's next action, timed in `generate_seconds`.

        Raises:
            ContextWindowExceeded: the action would not fit; it ends only this episode.
            PolicyError: the policy failed, which stops the run.
        """
        start = time.perf_counter()
        try:
            reply = await conversation.generate(params, allowed)
        except ContextWindowExceeded:
            raise
        except Exception as error:
            raise PolicyError(f"generation failed: {type(error).__name__}: {error}") from error
        self.generate_seconds += time.perf_counter() - start
        return reply

    async def _first_frame(
        self, env: Environment, settings: RolloutSettings, traj: Trajectory, frames: bool
    ) -> Callable[[], Any] | None:
        """Start `traj.frames` with the reset's frame; the env's render() when frames are kept."""
        render = getattr(env, "render", None) if frames else None
        if render is not None:
            traj.frames = [await self._frame(settings, render)]
        return render

    async def _frame(self, settings: RolloutSettings, render: Callable[[], Any]) -> str:
        """The env's frame now, encoded; a failing render() is noted, never fatal."""
        try:
            return encode_frame(await self._env_call(settings, render)) or ""
        except Exception as error:  # noqa: BLE001 - a picture must not cost the episode
            return f"(render() failed: {type(error).__name__}: {error})"


def _params(settings: RolloutSettings, spec: EpisodeSpec, turn: int) -> SamplingParams:
    """How to sample `turn` of an episode; the seed follows from the run, episode and turn."""
    return SamplingParams(
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        greedy=settings.greedy,
        seed=hash((settings.seed, spec.task_id, spec.group, spec.sample, turn)) % (2**62),
    )
