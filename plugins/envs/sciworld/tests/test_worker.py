"""Worker processes and their JVMs: recycled, never leaked, crashes raised (real processes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from agentgym_env_sciworld import SciWorldConfig, SciWorldEnv
from agentgym_env_sciworld.client import Worker, WorkerError

from agentgym_core.rollout.engine import EpisodeSpec, RolloutSettings
from agentgym_core.rollout.text import TextRolloutEngine
from agentgym_core.types import Termination

FIND_ANIMAL_TEST = 140_225
"""A test variation of find-animal: its room lists three wood cups, in hash-set order."""


def gone(pid: int, timeout: float = 20.0) -> bool:
    """True once `pid` has exited (a zombie counts: it runs nothing and holds no memory)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def env(java):
    """One env for the module, its worker killed and replaced by the tests in turn."""
    env = SciWorldEnv(SciWorldConfig(tasks=["find-animal"], recycle_after=2))
    yield env
    env.close()


def test_worker_is_recycled_and_the_new_jvm_gives_the_same_text(env):
    env.close()
    started = env.workers_started
    first = env.reset(FIND_ANIMAL_TEST)
    old = env.worker.pid, env.worker.jvm_pid
    assert env.reset(FIND_ANIMAL_TEST) == first and env.worker.pid == old[0]
    third = env.reset(FIND_ANIMAL_TEST)  # the third episode: recycle_after=2 replaced it
    assert env.workers_started == started + 2 and env.episodes_in_worker == 1
    assert env.worker.pid != old[0] and env.worker.jvm_pid != old[1]
    assert gone(old[0]) and gone(old[1])
    # Another JVM, same listing order (deterministic=True: constant identity hashes).
    assert third == first and "wood cup" in first


def test_a_crash_raises_instead_of_scoring_and_the_next_reset_recovers(env):
    for victim in ("jvm", "worker"):
        env.reset(FIND_ANIMAL_TEST)
        worker = env.worker
        os.kill(worker.jvm_pid if victim == "jvm" else worker.pid, signal.SIGKILL)
        # killed before or while the step is sent: either way the step raises, naming the worker
        said = rf"worker {worker.pid} ((failed in|died during) step|is gone \(.*\) before step)"
        with pytest.raises(WorkerError, match=said):
            env.step("open door to hallway")
        assert env.worker is None and env.done, victim
        assert gone(worker.pid) and gone(worker.jvm_pid), victim
    env.reset(FIND_ANIMAL_TEST)
    assert env.step("open door to hallway").reward == pytest.approx(0.08)


class JvmKillingPolicy:
    """A scripted text policy: always opens the door, but first kills the JVM of `envs[0]` once."""

    text_level = True

    def __init__(self, envs: list[SciWorldEnv]) -> None:
        self.envs, self.killed = envs, False
        self.pids: set[int] = set()

    async def chat(self, messages, params, allowed_actions=None) -> str:
        for env in self.envs:
            if env.worker is not None:
                self.pids |= {env.worker.pid, env.worker.jvm_pid}
        if not self.killed:
            os.kill(self.envs[0].worker.jvm_pid, signal.SIGKILL)
            self.killed = True
        return "open door to hallway"

    async def aclose(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_the_rollout_engine_records_a_crash_as_env_error_not_a_score(java):
    envs: list[SciWorldEnv] = []

    def factory() -> SciWorldEnv:
        envs.append(SciWorldEnv(SciWorldConfig(tasks=["find-animal"])))
        return envs[-1]

    policy = JvmKillingPolicy(envs)
    engine = TextRolloutEngine(factory, policy, env_threads=1)
    try:
        crashed, played = engine.run(
            [EpisodeSpec(FIND_ANIMAL_TEST, 0), EpisodeSpec(FIND_ANIMAL_TEST, 1)],
            RolloutSettings(max_turns=2, constrained=False, concurrency=1),
        )
    finally:
        engine.close()
    assert crashed.termination == Termination.ENV_ERROR and "WorkerError" in crashed.error
    assert played.termination == Termination.HORIZON and played.reward == pytest.approx(0.08)
    assert len(envs) == 2  # the broken env was dropped, a fresh one (and JVM) played on
    assert all(env.worker is None for env in envs) and len(policy.pids) == 4
    assert all(gone(pid) for pid in policy.pids)  # engine.close() closed the pool


def test_a_hung_worker_is_killed_after_the_call_timeout(env):
    env.reset(FIND_ANIMAL_TEST)
    worker = env.worker
    worker.call_timeout_s = 0.5
    os.kill(worker.pid, signal.SIGSTOP)  # alive but silent
    with pytest.raises(WorkerError, match="no answer to step in 0.5 s"):
        env.step("look around")
    assert worker.closed and gone(worker.pid) and gone(worker.jvm_pid)


def test_close_leaves_no_worker_or_java_process(env, java_descendants):
    env.reset(FIND_ANIMAL_TEST)
    pids = env.worker.pid, env.worker.jvm_pid
    assert psutil.Process(pids[1]).name() == "java"
    env.close()
    env.close()  # idempotent
    assert gone(pids[0]) and gone(pids[1])
    assert not java_descendants()


def test_missing_java_is_named():
    with pytest.raises(WorkerError, match="needs a Java runtime.*no-such-java.*ensure_java.sh"):
        Worker("no-such-java", [], call_timeout_s=30)


SCRIPT = """
import json, os, signal, sys
from agentgym_env_sciworld import SciWorldConfig, SciWorldEnv
env = SciWorldEnv(SciWorldConfig(tasks=["find-animal"]))
env.reset({task})
print(json.dumps([env.worker.pid, env.worker.jvm_pid]), flush=True)
if sys.argv[1] == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_nothing_outlives_its_parent(java):
    """atexit closes a forgotten env; a SIGKILLed parent's workers see EOF and stop their JVM."""
    code = textwrap.dedent(SCRIPT.format(task=FIND_ANIMAL_TEST))
    endings = {"exits": 0, "killed": -signal.SIGKILL}
    runs = {
        ending: subprocess.Popen(
            [sys.executable, "-c", code, ending], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for ending in endings
    }  # both at once: JVM start-up is most of the time
    for ending, run in runs.items():
        out, err = run.communicate(timeout=180)
        assert run.returncode == endings[ending], err.decode()
        worker_pid, jvm_pid = json.loads(out.decode().splitlines()[-1])
        assert gone(worker_pid) and gone(jvm_pid), ending
