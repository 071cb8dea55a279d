"""The asynchronous multi-turn rollout engine.

One asyncio task per episode. Environment calls run in a bounded thread pool
with a timeout; generation requests go to the policy, which batches whatever
is pending. An episode waiting on its environment never holds back another
that could be generating: there is no per-turn barrier.
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
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.types import Termination, Trajectory, Turn


class EnvCallTimeout(TimeoutError):
    """An environment call exceeded `env_timeout_s`."""


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


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to play: a task, its group (for group-relative advantages) and a sample index."""

    task_id: int
    group: int
    sample: int = 0


class EnvPool:
    """Reusable environment instances; a broken one is closed and replaced."""

    def __init__(self, factory: Callable[[], Environment]) -> None:
        self._factory = factory
        self._idle: list[Environment] = []
        self.created = 0

    def acquire(self) -> Environment:
        """An idle instance, or a new one."""
        if self._idle:
            return self._idle.pop()
        self.created += 1
        return self._factory()

    def release(self, env: Environment, *, broken: bool) -> None:
        """Return an instance; broken ones are closed, never reused."""
        if broken:
            with contextlib.suppress(Exception):  # already failing; closing is best effort
                env.close()
        else:
            self._idle.append(env)

    def close(self) -> None:
        """Close every idle instance."""
        while self._idle:
            self._idle.pop().close()


class RolloutEngine:
    """Plays episodes concurrently and turns them into trajectories."""

    def __init__(
        self,
        env_factory: Callable[[], Environment],
        policy: Policy,
        chat: ChatFormat,
        *,
        env_threads: int = 8,
    ) -> None:
        self.pool = EnvPool(env_factory)
        self.policy = policy
        self.chat = chat
        self._executor = concurrent.futures.ThreadPoolExecutor(env_threads, "env")
        self._instructions: dict[int, str] = {}
        self._sessions = itertools.count()
        self.env_seconds = 0.0
        self.generate_seconds = 0.0

    def close(self) -> None:
        """Close environments and threads."""
        self.pool.close()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def run(self, episodes: Sequence[EpisodeSpec], settings: RolloutSettings) -> list[Trajectory]:
        """Play every episode; returns trajectories in the order of `episodes`."""
        return asyncio.run(self.run_async(episodes, settings))

    async def run_async(
        self, episodes: Sequence[EpisodeSpec], settings: RolloutSettings
    ) -> list[Trajectory]:
        """Async form of `run`, for callers that already own an event loop."""
        slots = asyncio.Semaphore(settings.concurrency)

        async def bounded(spec: EpisodeSpec) -> Trajectory:
            async with slots:
                return await self._episode(spec, settings)

        return list(await asyncio.gather(*(bounded(spec) for spec in episodes)))

    async def _env_call(self, settings: RolloutSettings, fn: Callable[..., Any], *args: Any) -> Any:
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        try:
            return await asyncio.wait_for(
                loop.run_in_executor(self._executor, fn, *args), settings.env_timeout_s
            )
        except TimeoutError as error:
            raise EnvCallTimeout(
                f"{getattr(fn, '__qualname__', fn)} took longer than {settings.env_timeout_s} s"
            ) from error
        finally:
            self.env_seconds += time.perf_counter() - start

    async def _episode(self, spec: EpisodeSpec, settings: RolloutSettings) -> Trajectory:
        trajectory = Trajectory(task_id=spec.task_id, group=spec.group)
        env = self.pool.acquire()
        broken = False
        session = next(self._sessions)
        try:
            await self._play(env, spec, settings, trajectory, session)
        except Exception as error:  # noqa: BLE001 - infrastructure failure, recorded not raised
            broken = True
            trajectory.termination = Termination.ENV_ERROR
            trajectory.error = f"{type(error).__name__}: {error}"
        finally:
            self.pool.release(env, broken=broken)
            release = getattr(self.policy, "release", None)
            if release is not None:
                release(session)
        return trajectory

    async def _play(
        self,
        env: Environment,
        spec: EpisodeSpec,
        settings: RolloutSettings,
        traj: Trajectory,
        session: int,
    ) -> None:
        observation = await self._env_call(settings, env.reset, spec.task_id)
        if id(env) not in self._instructions:
            self._instructions[id(env)] = await self._env_call(settings, env.instruction)
        traj.task_group = await self._env_call(settings, env.task_group, spec.task_id)
        prompt = self.chat.prompt_ids(self._instructions[id(env)], observation)
        traj.prompt_length = len(prompt)
        self._append(traj, prompt, sampled=False)
        traj.termination = Termination.HORIZON
        for turn in range(settings.max_turns):
            if len(traj.token_ids) + settings.max_new_tokens > settings.max_context_tokens:
                traj.termination = Termination.CONTEXT_BUDGET
                return
            allowed = None
            if settings.constrained:
                allowed = await self._env_call(settings, env.valid_actions)
            params = SamplingParams(
                max_new_tokens=settings.max_new_tokens,
                temperature=settings.temperature,
                greedy=settings.greedy,
                seed=hash((settings.seed, spec.task_id, spec.group, spec.sample, turn)) % (2**62),
            )
            start = time.perf_counter()
            generation = await self.policy.generate(
                traj.token_ids, params, allowed, session=session
            )
            self.generate_seconds += time.perf_counter() - start
            start_index = len(traj.token_ids)
            self._append(traj, generation.token_ids, sampled=True, logprobs=generation.logprobs)
            for offset, ids in enumerate(generation.allowed or []):
                if ids is not None:
                    traj.constraints[start_index + offset] = tuple(ids)
            result = await self._env_call(settings, env.step, generation.text)
            traj.turns.append(
                Turn(
                    generation.text,
                    result.observation,
                    float(result.reward),
                    result.done,
                    dict(result.info),
                )
            )
            traj.reward += float(result.reward)
            if result.done or result.truncated:
                traj.success = bool(result.info.get("success", result.reward > 0))
                traj.termination = Termination.DONE
                return
            if turn + 1 == settings.max_turns:
                return  # horizon: no observation after the last action the agent may take
            delta = self.chat.observation_ids(result.observation)
            if (
                len(traj.token_ids) + len(delta) + settings.max_new_tokens
                > settings.max_context_tokens
            ):
                traj.termination = Termination.CONTEXT_BUDGET
                return
            self._append(traj, delta, sampled=False)

    @staticmethod
    def _append(
        traj: Trajectory,
        token_ids: Sequence[int],
        *,
        sampled: bool,
        logprobs: Sequence[float] | None = None,
    ) -> None:
        traj.token_ids.extend(int(t) for t in token_ids)
        traj.loss_mask.extend([1 if sampled else 0] * len(token_ids))
        traj.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(token_ids))
