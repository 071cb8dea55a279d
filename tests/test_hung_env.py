"""Every command finishes: an env call that never returns does not keep `agentgym` alive.

`agentgym train` and `agentgym eval` run as real subprocesses with the `hung`
env of `tests/hung_env.py` (loaded through an entry point, as an installed
plugin is), whose chosen `step` blocks forever. The run ends by success,
by a partial evaluation (exit 3) or by SIGTERM, and the process exits within
seconds of that end, saying in one line that it left the call behind.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from agentgym_core.rollout.threads import DaemonThreads, EnvThreads, error_trace

HERE = Path(__file__).resolve().parent
EXIT_SECONDS = 60.0
"""How long a process may take to exit after its last line. A stuck call used to make it
forever; an exit with none takes 2-6 s on a loaded 2-core machine (torch, MLflow), and 18 s
was seen with a benchmark and the suite sharing its 2 cores."""


@pytest.fixture(scope="module")
def plugin_env(tmp_path_factory) -> dict[str, str]:
    """Environment variables under which `agentgym` finds the `hung` env as an entry point."""
    site = tmp_path_factory.mktemp("hung-site")
    info = site / "agentgym_test_hung-0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: agentgym-test-hung\nVersion: 0.0\n"
    )
    (info / "entry_points.txt").write_text("[agentgym]\nhung = hung_env\n")
    path = os.pathsep.join(p for p in [str(HERE), str(site), os.environ.get("PYTHONPATH")] if p)
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")


def _config(tmp_path: Path, model: Path, **env_options) -> Path:
    raw = {
        "run": {"name": "hung", "output_dir": str(tmp_path / "run"), "seed": 1},
        "model": {"path": str(model)},
        "env": {"name": "hung", **env_options},
        "algorithm": {"name": "grpo"},
        "scheduler": {"name": "fixed", "max_turns": 2},
        "rollout": {"max_context_tokens": 512, "env_timeout_s": 2.0, "env_recovery_s": 5},
        "trainer": {"steps": 2, "tasks_per_step": 2, "group_size": 2, "checkpoint_every": 1},
        "eval": {"split": "test", "num_tasks": 2, "k": 1, "max_turns": 2, "env_error_retries": 1},
        "tracking": {"log_trajectories": 0},
    }
    path = tmp_path / "hung.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


class Timed:
    """A real `agentgym` process whose output lines are timed as they come."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        command = [sys.executable, "-m", "agentgym_core.cli", *args]
        self.process = subprocess.Popen(
            command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.lines: list[tuple[float, str, str]] = []
        self._readers = [
            threading.Thread(target=self._read, args=(stream, name), daemon=True)
            for stream, name in ((self.process.stdout, "out"), (self.process.stderr, "err"))
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, name: str) -> None:
        for line in stream:
            self.lines.append((time.monotonic(), name, line.rstrip("\n")))

    def wait(self, timeout: float = 300) -> float:
        """The exit status' time; fails the test if the process is still running at `timeout`."""
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"still running after {timeout} s:\n{self.text()[-4000:]}")
        exited = time.monotonic()
        for reader in self._readers:
            reader.join(10)
        return exited

    def when(self, text: str) -> float:
        """When the first line containing `text` came."""
        found = [at for at, _, line in self.lines if text in line]
        assert found, f"{text!r} never printed:\n{self.text()[-4000:]}"
        return found[0]

    def text(self, stream: str | None = None) -> str:
        return "\n".join(line for _, name, line in self.lines if stream in (None, name))


def test_train_finishes_and_exits_though_a_step_never_returns(tmp_path, tiny_model_dir, plugin_env):
    config = _config(tmp_path, tiny_model_dir, hang_times=1)
    run = Timed(plugin_env, "train", str(config), "--no-progress")
    exited = run.wait()
    assert run.process.returncode == 0, run.text()[-4000:]
    checkpoints = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert checkpoints == ["step-000001", "step-000002"]
    said = (
        "agentgym: 1 env call still running after env_timeout_s (HungEnv.step); not waiting for it"
    )
    assert run.text("err").count(said) == 1, run.text()[-4000:]
    assert exited - run.when("stage train (train):") < EXIT_SECONDS


def test_a_partial_eval_exits_3_though_its_steps_never_return(tmp_path, tiny_model_dir, plugin_env):
    config = _config(tmp_path, tiny_model_dir, hang_task=100, hang_times=-1)
    run = Timed(plugin_env, "eval", str(config), f"model.path={tiny_model_dir}")
    exited = run.wait()
    assert run.process.returncode == 3, run.text()[-4000:]
    assert "PARTIAL EVALUATION: 1 of 2 episodes still ended in env_error" in run.text("err")
    assert "HungEnv.step took longer than 2.0 s" in run.text("err")
    # the first try and the retry: two calls left hanging
    said = "agentgym: 2 env calls still running after env_timeout_s (HungEnv.step); not waiting "
    assert said + "for them" in run.text("err")
    assert exited - run.when("PARTIAL EVALUATION") < EXIT_SECONDS


def test_expert_data_stops_on_a_step_that_never_returns(tmp_path, plugin_env):
    """`data expert` calls the env outside the engine: the same timeout, the same exit."""
    out = tmp_path / "expert.json"
    run = Timed(
        plugin_env,
        *("data", "expert", "hung", "-o", "hang_times=1", "--episodes", "3"),
        *("--out", str(out), "--env-timeout-s", "2"),
    )
    exited = run.wait(timeout=120)
    assert run.process.returncode == 2, run.text()[-4000:]
    said = "environment 'hung', task 0: HungEnv.step took longer than 2.0 s; left running"
    assert said in run.text("err"), run.text()[-4000:]
    assert not out.exists()  # no data from a broken run
    assert exited - run.when(said) < EXIT_SECONDS


def test_sigterm_during_a_hung_step_exits_at_once(tmp_path, tiny_model_dir, plugin_env):
    marker = tmp_path / "hanging"
    config = _config(tmp_path, tiny_model_dir, hang_times=1, marker=str(marker))
    overrides = ["rollout.env_timeout_s=600"]  # the call is still running when the signal comes
    run = Timed(plugin_env, "train", str(config), *overrides, "--no-progress")
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert run.process.poll() is None, run.text()[-4000:]
        assert time.monotonic() < deadline, "the hung step never started"
        time.sleep(0.1)
    time.sleep(0.5)  # well inside the call
    signalled = time.monotonic()
    run.process.send_signal(signal.SIGTERM)
    exited = run.wait(timeout=120)
    assert run.process.returncode == 128 + signal.SIGTERM, run.text()[-4000:]
    assert exited - signalled < EXIT_SECONDS
    said = "agentgym: 1 env call still running (HungEnv.step); not waiting for it"
    assert said in run.text("err")  # not past its timeout yet, and left all the same


# -- the threads themselves, in this process ---------------------------------------


def test_daemon_threads_run_calls_and_leave_a_stuck_one_behind():
    threads = DaemonThreads("test")
    release = threading.Event()
    stuck = threads.submit(release.wait)
    assert threads.submit(lambda x: x + 1, 1).result(5) == 2  # a new worker, not the stuck one
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("test_"))
    deadline = time.monotonic() + 10  # the worker may not be inside the call yet
    while "in wait" not in "".join(threads.stack(stuck)):
        assert time.monotonic() < deadline, threads.stack(stuck)
        time.sleep(0.02)
    threads.shutdown()
    with pytest.raises(RuntimeError):
        threads.submit(print)
    release.set()
    assert stuck.result(5) is True


class Wedged:
    def __init__(self) -> None:
        self.release = threading.Event()

    def step(self, action):
        self.release.wait()


def test_a_timeout_says_where_the_call_hangs_and_shutdown_says_it_is_left_once(capsys):
    import asyncio

    threads, env = EnvThreads(2), Wedged()

    async def hang():
        await threads.call(2.0, env.step, "go")

    with pytest.raises(TimeoutError) as raised:
        asyncio.run(hang())
    trace = error_trace(raised.value)
    assert trace.startswith("Wedged.step took longer than 2.0 s and still runs, here:")
    assert "in step\n    self.release.wait()" in trace  # the env's line, not the engine's
    assert "_worker" not in trace
    assert threads.stuck == 1
    threads.shutdown()
    threads.shutdown()
    said = (
        "agentgym: 1 env call still running after env_timeout_s (Wedged.step); not waiting for it"
    )
    assert capsys.readouterr().err.count(said) == 1
    env.release.set()
    deadline = time.monotonic() + 5
    while threads.stuck and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threads.stuck == 0


def test_error_trace_keeps_the_innermost_frames_bounded():
    def deep(n):
        if n == 0:
            raise ConnectionError("server went away " + "x" * 2000)
        deeper(n - 1)

    def deeper(n):
        deep(n)  # two functions in turn: Python would fold one repeated frame into a line

    try:
        deep(40)
    except ConnectionError as error:
        trace = error_trace(error)
    lines = trace.splitlines()
    assert len(lines) <= 21 and len(trace) <= 4096 + 100
    assert lines[0].startswith("... (") and "earlier lines left out" in lines[0]
    assert lines[-1].startswith("ConnectionError: server went away xxx")
    assert "in deep" in trace and "test_hung_env.py" in trace


async def _cancel_after_return(start_call, loop_turns: int) -> str:
    """Start `start_call(fn)` on a call that returns at once, let the event loop turn
    `loop_turns` times after it returned, then cancel the waiting task.

    Returns "cancelled", "played on" (the cancel was lost: the task returned the value)
    or "finished first".
    """
    import asyncio

    returned = threading.Event()

    def call() -> str:
        returned.set()
        return "value"

    task = asyncio.ensure_future(start_call(call))
    while not returned.is_set():
        await asyncio.sleep(0)
    for _ in range(loop_turns):  # the result is on its way through the loop's callbacks
        await asyncio.sleep(0)
    if task.done():
        return "finished first"
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        return "cancelled"
    return "played on"


def test_a_cancelled_call_stays_cancelled_though_it_returned_a_moment_before():
    """On Python 3.11, wait_for returned the value of a call that finished just before the
    cancel: the cancelled episode played on, then waited forever on a stopped policy."""
    import asyncio

    async def every_moment() -> list[str]:
        threads = EnvThreads(2)
        try:
            start = functools.partial(threads.call, 5.0)
            return [await _cancel_after_return(start, turns) for turns in range(6)]
        finally:
            threads.shutdown()

    outcomes = asyncio.run(every_moment())
    assert "played on" not in outcomes
    assert outcomes.count("cancelled") >= 2  # the moments between return and wake-up


def test_a_cancelled_server_env_call_stays_cancelled_though_it_returned_a_moment_before():
    """The env servers' calls (`SessionStore.call`) had the same wait_for: a request or a
    shutdown cancelled as its env call returned would carry on."""
    import asyncio

    from agentgym_core.serve.sessions import SessionStore

    async def every_moment() -> list[str]:
        store = SessionStore(lambda: None, threads=2, env_timeout_s=5.0)
        try:
            return [await _cancel_after_return(store.call, turns) for turns in range(6)]
        finally:
            store.executor.shutdown()

    outcomes = asyncio.run(every_moment())
    assert "played on" not in outcomes
    assert outcomes.count("cancelled") >= 2
