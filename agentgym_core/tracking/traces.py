"""Episodes as MLflow traces, written straight to one tracking store.

MLflow's tracing APIs (`mlflow.start_span`, `MlflowClient.start_trace`) export
through one process-wide OpenTelemetry provider bound to the global tracking
URI, asynchronously. Two trackers with two stores in one process (tests, a
pipeline) would mix, and a crash could drop queued traces. So a finished
episode is built here as immutable spans and written synchronously with the
tracking store's own calls (`log_spans`, then `start_trace`), which is what
MLflow's exporter does once a trace ends.

Layout of one trace (name `episode`):

- root span `episode` (type AGENT): inputs `{task_id, task_group}`, outputs
  `{reward, success, termination}`, attributes `agentgym.step`,
  `agentgym.split`, `agentgym.group`, `agentgym.num_turns`, `agentgym.error`,
  `agentgym.error_trace` (the innermost frames); status ERROR for env errors.
- one child span `turn-<i>` (type TOOL, i from 0) per turn: inputs
  `{action}`, outputs `{observation, reward, done}`, attribute `agentgym.info`.

Span times are logging times laid out in order (1 µs per turn), not play
times: trajectories carry no clock.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Sequence
from typing import Any

from mlflow.entities import Span, SpanType, TraceData, TraceInfo, TraceLocation, TraceState
from mlflow.tracing.client import TracingClient
from mlflow.tracing.constant import (
    TRACE_SCHEMA_VERSION,
    TRACE_SCHEMA_VERSION_KEY,
    SpanAttributeKey,
    TraceMetadataKey,
    TraceTagKey,
)
from mlflow.tracing.utils import build_otel_context, generate_mlflow_trace_id_from_otel_trace_id
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Status, StatusCode

from agentgym_core.types import Termination, Trajectory

ROOT_SPAN = "episode"
PREVIEW_CHARS = 1000
_TURN_NS = 1_000
_EMPTY_RESOURCE = Resource.get_empty()


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _span(
    name: str,
    *,
    trace_id: str,
    otel_trace_id: int,
    parent: int | None,
    span_type: str,
    start_ns: int,
    end_ns: int,
    inputs: dict[str, Any],
    outputs: dict[str, Any],
    attributes: dict[str, Any],
    error: str | None = None,
) -> Span:
    attrs = {
        SpanAttributeKey.REQUEST_ID: _dump(trace_id),
        SpanAttributeKey.SPAN_TYPE: _dump(span_type),
        SpanAttributeKey.INPUTS: _dump(inputs),
        SpanAttributeKey.OUTPUTS: _dump(outputs),
        **{key: _dump(value) for key, value in attributes.items()},
    }
    status = Status(StatusCode.ERROR, error) if error else Status(StatusCode.OK)
    otel = ReadableSpan(
        name=name,
        context=build_otel_context(otel_trace_id, secrets.randbits(64) or 1),
        parent=build_otel_context(otel_trace_id, parent) if parent else None,
        start_time=start_ns,
        end_time=end_ns,
        attributes=attrs,
        status=status,
        resource=_EMPTY_RESOURCE,
    )
    return Span(otel)


def episode_trace(
    traj: Trajectory, *, step: int, split: str, run_id: str, experiment_id: str
) -> tuple[TraceInfo, list[Span]]:
    """The trace info and spans (root first) of one episode."""
    # `secrets`, not `random`: the trainer seeds the global RNG for reproducible resumes.
    otel_trace_id = secrets.randbits(128) or 1
    trace_id = generate_mlflow_trace_id_from_otel_trace_id(otel_trace_id)
    start = time.time_ns()
    end = start + _TURN_NS * max(traj.num_turns, 1)
    failed = traj.termination == Termination.ENV_ERROR
    inputs = {"task_id": traj.task_id, "task_group": traj.task_group}
    outputs = {
        "reward": traj.reward,
        "success": traj.success,
        "termination": str(traj.termination),
    }
    root = _span(
        ROOT_SPAN,
        trace_id=trace_id,
        otel_trace_id=otel_trace_id,
        parent=None,
        span_type=SpanType.AGENT,
        start_ns=start,
        end_ns=end,
        inputs=inputs,
        outputs=outputs,
        attributes={
            "agentgym.step": step,
            "agentgym.split": split,
            "agentgym.group": traj.group,
            "agentgym.num_turns": traj.num_turns,
            "agentgym.error": traj.error,
            "agentgym.error_trace": traj.error_trace,
        },
        error=(traj.error or "env_error") if failed else None,
    )
    root_id = root._span.context.span_id
    spans = [root]
    for i, turn in enumerate(traj.turns):
        spans.append(
            _span(
                f"turn-{i}",
                trace_id=trace_id,
                otel_trace_id=otel_trace_id,
                parent=root_id,
                span_type=SpanType.TOOL,
                start_ns=start + i * _TURN_NS,
                end_ns=start + (i + 1) * _TURN_NS,
                inputs={"action": turn.action},
                outputs={"observation": turn.observation, "reward": turn.reward, "done": turn.done},
                attributes={"agentgym.info": turn.info},
            )
        )
    info = TraceInfo(
        trace_id=trace_id,
        trace_location=TraceLocation.from_experiment_id(experiment_id),
        request_time=start // 1_000_000,
        execution_duration=(end - start) // 1_000_000,
        state=TraceState.ERROR if failed else TraceState.OK,
        request_preview=_dump(inputs)[:PREVIEW_CHARS],
        response_preview=_dump(outputs)[:PREVIEW_CHARS],
        trace_metadata={
            TRACE_SCHEMA_VERSION_KEY: str(TRACE_SCHEMA_VERSION),
            TraceMetadataKey.SOURCE_RUN: run_id,
        },
        tags={
            TraceTagKey.TRACE_NAME: ROOT_SPAN,
            "agentgym.step": str(step),
            "agentgym.split": split,
            "agentgym.task_id": str(traj.task_id),
            "agentgym.success": str(traj.success).lower(),
        },
    )
    return info, spans


class TraceWriter:
    """Writes finished episodes to the store at `uri`, linked to `run_id`."""

    def __init__(self, uri: str, *, run_id: str, experiment_id: str) -> None:
        self._client = TracingClient(uri)
        self._run_id = run_id
        self._experiment_id = experiment_id
        self._span_logging = True

    def write(self, trajectories: Sequence[Trajectory], *, step: int, split: str) -> list[str]:
        """Log one trace per trajectory; returns the trace ids."""
        built = [
            episode_trace(
                t, step=step, split=split, run_id=self._run_id, experiment_id=self._experiment_id
            )
            for t in trajectories
        ]
        if not built:
            return []
        # Trace rows first: spans logged before them make each `start_trace` take
        # MLflow's slower merge path.
        stored = [self._client.start_trace(info) for info, _ in built]
        if self._span_logging:
            try:  # SQL stores keep spans in tables: one call for every span of the step.
                self._client.log_spans(self._experiment_id, [s for _, ss in built for s in ss])
                return [info.trace_id for info in stored]
            except Exception as error:  # servers on a file store answer "not supported"
                if not isinstance(error, NotImplementedError) and "not supported" not in str(error):
                    raise
                self._span_logging = False
        for info, (_, spans) in zip(stored, built, strict=True):
            # Stores without span tables (file store, older servers) keep spans as artifacts.
            self._client._upload_trace_data(info, TraceData(spans=spans))
        return [info.trace_id for info, _ in built]
