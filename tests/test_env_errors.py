"""An env_error episode keeps where it failed: the innermost frames of the exception, bounded."""

from __future__ import annotations

import json
import threading

import pytest
from colour_env import ColourEnv

from agentgym_core.policies.hf import HFPolicy, HFPolicyConfig
from agentgym_core.rollout.chat import ChatFormat
from agentgym_core.rollout.engine import EpisodeSpec, RolloutEngine, RolloutSettings
from agentgym_core.tracking.mlflow_tracker import jsonl
from agentgym_core.types import Termination, Trajectory


@pytest.fixture(scope="module")
def engine_for(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    engines = []

    def make(env_factory, **options):
        policy = HFPolicy(HFPolicyConfig(), model=model, tokenizer=tokenizer)
        chat = ChatFormat(tokenizer, model.generation_config)
        engines.append(RolloutEngine(env_factory, policy, chat, **options))
        return engines[-1]

    yield make
    for engine in engines:
        engine.close()


class DeepCrash(ColourEnv):
    """Task 1's step fails three calls deep, as a simulator's client would."""

    def step(self, action):
        if self.task == 1:
            self._send(action)
        return super().step(action)

    def _send(self, action):
        self._receive()

    def _receive(self):
        raise ConnectionError("the simulator closed the connection")


def test_an_env_error_keeps_type_message_and_innermost_frames(engine_for):
    engine = engine_for(DeepCrash)
    out = engine.run([EpisodeSpec(0, 0), EpisodeSpec(1, 1)], RolloutSettings(max_turns=2, seed=0))
    ok, failed = out
    assert ok.termination != Termination.ENV_ERROR and ok.error is None and ok.error_trace is None
    assert failed.termination == Termination.ENV_ERROR
    assert failed.error == "ConnectionError: the simulator closed the connection"
    lines = failed.error_trace.splitlines()
    assert lines[-1] == failed.error
    frames = [line for line in lines if line.startswith("  File ")]
    assert frames[-3:] == [
        f'  File "{__file__}", line {_line_of(DeepCrash.step, "self._send")}, in step',
        f'  File "{__file__}", line {_line_of(DeepCrash._send, "self._receive")}, in _send',
        f'  File "{__file__}", line {_line_of(DeepCrash._receive, "raise")}, in _receive',
    ]
    assert len(lines) <= 21 and len(failed.error_trace) <= 4200


def _line_of(function, text: str) -> int:
    import inspect

    lines, start = inspect.getsourcelines(function)
    return start + next(i for i, line in enumerate(lines) if text in line)


class Wedged(ColourEnv):
    """Task 0's step waits until released."""

    release = threading.Event()

    def step(self, action):
        if self.task == 0:
            self._wait_for_simulator()
        return super().step(action)

    def _wait_for_simulator(self):
        Wedged.release.wait()


def test_a_timed_out_call_records_where_it_hangs(engine_for):
    engine = engine_for(Wedged)
    try:
        (hung,) = engine.run([EpisodeSpec(0, 0)], RolloutSettings(max_turns=2, env_timeout_s=2.0))
    finally:
        Wedged.release.set()
    assert hung.error == "EnvCallTimeout: Wedged.step took longer than 2.0 s"
    lines = hung.error_trace.splitlines()
    assert lines[0] == "Wedged.step took longer than 2.0 s and still runs, here:"
    assert any(line.endswith(", in _wait_for_simulator") for line in lines)
    assert lines[-1].strip() == "waiter.acquire()"  # innermost: inside Event.wait
    assert not any("rollout/engine.py" in line for line in lines)  # the env's frames only


def test_error_trace_round_trips_and_old_trajectories_still_load():
    traj = Trajectory(
        task_id=3,
        group=0,
        termination=Termination.ENV_ERROR,
        error="ConnectionError: refused",
        error_trace='  File "client.py", line 9, in step\nConnectionError: refused',
    )
    again = Trajectory.from_dict(json.loads(json.dumps(traj.to_dict())))
    assert again.error_trace == traj.error_trace and again == traj
    logged = json.loads(jsonl([traj]))  # what the tracker logs, and the viewer reads
    assert logged["error_trace"] == traj.error_trace
    old = traj.to_dict()
    del old["error_trace"]  # saved before the field existed
    assert Trajectory.from_dict(old).error_trace is None
