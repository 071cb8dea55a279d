"""`recovery`: the probe and its backoff, on envs that fail a set number of times (unit tests)."""

from __future__ import annotations

import time

from agentgym_core.run.recovery import probe, wait_for_env


class Flaky:
    """Construction fails `down` more times (a server still restarting); `bad` tasks never reset."""

    down = 0
    closed = 0

    def __init__(self, bad=()):
        if Flaky.down > 0:
            Flaky.down -= 1
            raise ConnectionError("connection refused")
        self.bad = set(bad)

    def reset(self, task):
        if task in self.bad:
            raise ValueError(f"task {task} is broken")
        return "ok"

    def close(self):
        Flaky.closed += 1


class Clock:
    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def test_backoff_doubles_until_the_env_answers():
    Flaky.down, clock, said = 5, Clock(), []
    back = wait_for_env(
        Flaky, [1], deadline=100, timeout_s=5, say=said.append, sleep=clock.sleep, clock=clock
    )
    assert back and clock.sleeps == [1, 2, 4, 8, 16]
    assert (
        said[0]
        == "the environment is down (ConnectionError: connection refused); next probe in 1 s"
    )
    assert said[-1] == "the environment answers again after 31 s"


def test_the_deadline_ends_the_wait_and_backoff_is_capped():
    Flaky.down, clock, said = 10**6, Clock(), []
    back = wait_for_env(
        Flaky, [1], deadline=100, timeout_s=5, say=said.append, sleep=clock.sleep, clock=clock
    )
    assert not back and sum(clock.sleeps) == 100 and max(clock.sleeps) == 30
    assert said[-1] == "the environment is still down: ConnectionError: connection refused"


def test_one_broken_task_is_not_an_outage_and_the_probe_env_is_closed():
    Flaky.down, Flaky.closed = 0, 0
    assert probe(lambda: Flaky(bad={1}), [1, 2], timeout_s=5) is None
    assert probe(lambda: Flaky(bad={1, 2}), [1, 2], timeout_s=5) == "ValueError: task 2 is broken"
    assert Flaky.closed == 2


def test_a_hung_probe_counts_as_down():
    def hangs():
        time.sleep(5)

    started = time.monotonic()
    assert probe(hangs, [1], timeout_s=0.2) == "no answer within 0.2 s"
    assert time.monotonic() - started < 2


# -- replay_env_errors: the one policy of training and evaluation -----------------------------


class Spec:
    def __init__(self, task_id):
        self.task_id = task_id


def _episode(task_id, error):
    from agentgym_core.types import Termination, Trajectory

    termination = Termination.ENV_ERROR if error else Termination.DONE
    error = "gone" if error else None
    return Trajectory(task_id=task_id, group=0, termination=termination, error=error)


class Player:
    """Plays specs; each task in `failing` ends in env_error that many more times."""

    def __init__(self, failing):
        self.failing, self.calls = dict(failing), []

    def __call__(self, specs):
        self.calls.append([s.task_id for s in specs])
        out = []
        for spec in specs:
            left = self.failing.get(spec.task_id, 0)
            self.failing[spec.task_id] = left - 1
            out.append(_episode(spec.task_id, left > 0))
        return out


def _replay(player, errors, *, retries=3, fraction=0.5, recovery_s=60.0, down=0):
    from agentgym_core.run.recovery import ReplayRules, replay_env_errors

    Flaky.down, clock, said = down, Clock(), []
    specs = [Spec(task) for task in range(4)]
    played = [_episode(task, task in errors) for task in range(4)]
    rules = ReplayRules(retries, fraction, recovery_s, probe_timeout_s=5.0)
    out, replayed = replay_env_errors(
        player, specs, played, rules, Flaky, say=said.append, sleep=clock.sleep, clock=clock
    )
    return out, replayed, said


def test_a_few_env_errors_are_replayed_at_once_without_waiting():
    player = Player({})
    out, replayed, said = _replay(player, errors={2})
    assert player.calls == [[2]] and replayed == 1
    assert said == ["1 of 4 episodes ended in env_error (last: gone); replay 1 of 3 now"]
    assert [t.termination.value for t in out] == ["done"] * 4


def test_an_outage_waits_for_the_env_before_its_first_replay():
    player = Player({})
    out, replayed, said = _replay(player, errors={0, 1, 3}, down=2)
    assert said[0] == (
        "3 of 4 episodes ended in env_error (last: gone); replay 1 of 3 once the env answers "
        "(waiting up to 60 s)"
    )
    assert "the environment answers again after 3 s" in said  # two failed probes: 1 s, 2 s
    assert player.calls == [[0, 1, 3]] and replayed == 3


def test_the_retries_bound_an_episode_that_always_fails_and_a_few_never_wait():
    player = Player({2: 99})
    out, replayed, said = _replay(player, errors={2}, retries=3, down=99)  # probes would fail
    assert player.calls == [[2], [2], [2]] and replayed == 3
    assert said == [
        f"1 of 4 episodes ended in env_error (last: gone); replay {n} of 3 now" for n in (1, 2, 3)
    ]
    assert out[2].termination.value == "env_error"  # the caller judges: partial, or an outage


def test_an_env_still_down_at_the_deadline_is_not_played_again():
    player = Player({})
    out, replayed, said = _replay(player, errors={0, 1}, recovery_s=3.0, down=99)
    assert player.calls == [] and replayed == 0
    assert said[-1] == "the environment is still down: ConnectionError: connection refused"
