"""The worker process: one ScienceWorld JVM, driven over a private socket by its parent.

Run as `python -m agentgym_env_sciworld.worker FD OPTIONS_JSON`; the parent
(`client.Worker`) starts it. Requests are `(op, kwargs)` tuples; replies are
`("ok", value)` or `("error", message)`.

It talks to ScienceWorld's `PythonInterface` through py4j directly, not
through `scienceworld.ScienceWorldEnv`: the package's `step` also enumerates
every valid action and reads the room, inventory and task text on each call,
about 90% of a step's time, which an agent that writes its own actions never
uses. Valid actions are enumerated only when asked (`valid_actions`).

Nothing outlives it: the JVM runs with py4j's `--die-on-broken-pipe`, so it
exits when this process's end of its stdin closes, whether the worker exits,
crashes or is killed; and the worker exits when the parent's end of the socket
closes, for the same reasons.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any

from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
from scienceworld.constants import BASEPATH, JAR_PATH

LOOK = "look around"


class Simulator:
    """One ScienceWorld JVM and the calls the environment needs."""

    def __init__(self, java: str, jvm_options: list[str]) -> None:
        port, self.process = launch_gateway(
            classpath=JAR_PATH,
            javaopts=jvm_options,
            die_on_exit=True,
            cwd=BASEPATH,
            return_proc=True,
            java_path=java,
            redirect_stderr=sys.stderr,
        )
        self.gateway = JavaGateway(
            gateway_parameters=GatewayParameters(port=port, auto_field=True),
            java_process=self.process,
        )
        self.server = self.gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()

    def splits(self, task_types: list[str]) -> dict[str, dict[str, list[int]]]:
        """ScienceWorld's train/dev/test variations of each task type.

        Its split functions read the interface's current task name, which `load`
        sets; setting the name alone gives the same lists 8x faster than building
        each task's world (0.8 s against 6.6 s for all 30 types).
        """
        set_task_name = getattr(self.server, "taskStr_$eq")  # Scala's setter of `taskStr`
        out = {}
        for task_type in task_types:
            set_task_name(task_type)
            out[task_type] = {
                "train": [int(v) for v in self.server.getVariationsTrain()],
                "dev": [int(v) for v in self.server.getVariationsDev()],
                "test": [int(v) for v in self.server.getVariationsTest()],
            }
        return out

    def load(
        self, task_type: str, variation: int, simplifications: str, gold: bool = False
    ) -> dict[str, Any]:
        """Start a variation; returns the task text, the first `look around` and the gold path."""
        limit = int(self.server.getTaskMaxVariations(task_type))
        if not 0 <= variation < limit:
            raise ValueError(f"{task_type} has variations 0..{limit - 1}, not {variation}")
        self.server.load(task_type, variation, simplifications, gold)
        return {
            "task_description": str(self.server.getTaskDescription()),
            "observation": str(self.server.step(LOOK)),
            "gold": [str(a) for a in self.server.getGoldActionSequence()] if gold else None,
        }

    def step(self, action: str) -> tuple[str, float, bool, int]:
        """(observation, score in [-1, 1], completed flag, moves so far)."""
        observation = str(self.server.step(action))
        return (
            observation,
            float(self.server.getScore()),
            bool(self.server.getCompleted()),
            int(self.server.getNumMoves()),
        )

    def valid_actions(self) -> list[str]:
        """ScienceWorld's valid action-object combinations in the current state, sorted.

        Read as one JSON string: converting the Java list costs a py4j round trip
        per entry (565 ms against 170 ms for 939 actions).
        """
        listing = json.loads(self.server.getValidActionObjectCombinationsJSON())
        return sorted(entry["action"] for entry in listing["validActions"])

    def gold(
        self, task_type: str, variation: int, simplifications: str, history: list[str]
    ) -> list[str]:
        """The gold path of the running episode; the state is rebuilt by replaying `history`."""
        path = self.load(task_type, variation, simplifications, gold=True)["gold"]
        for action in history:
            self.server.step(action)
        return path

    def close(self) -> None:
        """Stop the JVM (shut the gateway down, then make sure the process is gone)."""
        try:
            self.gateway.shutdown()
        finally:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait(timeout=10)


OPS = ("splits", "load", "step", "valid_actions", "gold")
"""What a parent may ask for; anything else is an error reply."""


def serve(conn: Connection, simulator: Simulator) -> None:
    """Answer requests until the parent says `close` or goes away."""
    while True:
        try:
            op, kwargs = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if op == "close":
            conn.send(("ok", None))
            return
        try:
            if op not in OPS:
                raise ValueError(f"unknown op {op!r}; ops: {', '.join(OPS)}")
            reply = ("ok", getattr(simulator, op)(**kwargs))
        except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it
            reply = ("error", f"{type(error).__name__}: {error}")
        conn.send(reply)


def main(argv: list[str]) -> int:
    """Start the JVM, say `ready` (or why not), then serve."""
    conn = Connection(int(argv[0]))
    options = json.loads(argv[1])
    # A signal ends the worker through `finally`, so the JVM is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    try:
        simulator = Simulator(options["java"], options["jvm_options"])
    except Exception as error:  # noqa: BLE001 - the parent raises it with context
        conn.send(("error", f"{type(error).__name__}: {error}"))
        return 1
    try:
        conn.send(("ok", {"worker_pid": os.getpid(), "jvm_pid": simulator.process.pid}))
        serve(conn, simulator)
    finally:
        simulator.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
