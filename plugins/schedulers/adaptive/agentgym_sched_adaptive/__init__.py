"""The `adaptive` horizon scheduler: lengthen the horizon when success stops improving.

ScalingInter-RL (arXiv 2509.08755) fixes its stage lengths in advance. Here the
turn limit grows when training success has plateaued at the current one, and,
optionally, shrinks back one step after a collapse there.

The one design decision: no state. `max_turns(step, history)` replays every
decision from the start of `history[:step]` (update i's metrics, which the
trainer checkpoints), so a resumed run makes exactly the decisions the
uninterrupted run made, and calls may come in any order.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentgym_core.api import Register, hookimpl

_log = logging.getLogger(__name__)


class AdaptiveConfig(BaseModel):
    """Options of the `adaptive` scheduler."""

    model_config = ConfigDict(extra="forbid")

    min_turns: int = Field(1, gt=0, description="The horizon never goes below this.")
    max_turns: int = Field(gt=0, description="The horizon never grows past this.")
    start_turns: int | None = Field(
        None, gt=0, description="Horizon of the first update; null: min_turns."
    )
    grow_by: int = Field(1, gt=0, description="Turns added at a plateau (unless grow_factor).")
    grow_factor: float | None = Field(
        None,
        gt=1,
        description="Multiply the horizon by this at a plateau instead (rounded up, at least "
        "+1 turn); shrinking divides by it (rounded down, at least -1 turn).",
    )
    window: int = Field(5, gt=0, description="Updates in the moving average of the metric.")
    patience: int = Field(
        10,
        gt=0,
        description="Updates at one horizon before it may grow; at least 2 * window, since "
        "a plateau compares the last two windows.",
    )
    threshold: float = Field(
        0.02,
        ge=0,
        description="Plateau: the last window's mean rose less than this over the window "
        "before it (success rates are in [0, 1]).",
    )
    shrink: bool = Field(
        False, description="Shrink one step after a collapse at the current horizon."
    )
    collapse_fraction: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="Collapse: the moving average fell below this fraction of the way from "
        "metric_floor to its best at the current horizon, i.e. it lost more than "
        "1 - collapse_fraction of its height above the floor.",
    )
    metric_floor: float = Field(
        0.0,
        description="The lowest value the metric can take, from which a collapse is measured: "
        "0 for success rates, -1 for rewards in [-1, 1]. With shrink, a value below it is an "
        "error.",
    )
    metric: str = Field(
        "rollout/success_rate", min_length=1, description="The history key that is watched."
    )

    @model_validator(mode="after")
    def _check(self) -> AdaptiveConfig:
        if self.min_turns > self.max_turns:
            raise ValueError(
                f"min_turns ({self.min_turns}) must not exceed max_turns ({self.max_turns})"
            )
        start = self.start
        if not self.min_turns <= start <= self.max_turns:
            raise ValueError(
                f"start_turns ({start}) must be within [min_turns, max_turns] "
                f"= [{self.min_turns}, {self.max_turns}]"
            )
        if self.patience < 2 * self.window:
            raise ValueError(
                f"patience ({self.patience}) must be at least 2 * window ({2 * self.window}): "
                "a plateau compares the last two windows at one horizon"
            )
        if self.grow_factor is not None and "grow_by" in self.model_fields_set:
            raise ValueError("give at most one of `grow_by` and `grow_factor`")
        return self

    @property
    def start(self) -> int:
        """The first update's horizon."""
        return self.start_turns if self.start_turns is not None else self.min_turns


@dataclass(frozen=True)
class Decision:
    """A change of horizon: from update `step` on, `after` turns instead of `before`."""

    step: int
    before: int
    after: int
    reason: str


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


class AdaptiveScheduler:
    """Grows the horizon at a plateau of `metric`, shrinks it after a collapse if enabled."""

    def __init__(self, config: AdaptiveConfig) -> None:
        self.config = config

    def max_turns(self, step: int, history: Sequence[Mapping[str, float]]) -> int:
        """Turn limit at 0-based update `step`, replayed from `history[:step]`.

        Entries past `step` are ignored, so the answer for a step never depends on
        what came after it; with fewer entries than `step`, all of them are used.
        The change that takes effect at `step`, if any, is logged at INFO.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        horizon, decisions = self.replay(history[:step])
        if decisions and decisions[-1].step == step:
            last = decisions[-1]
            _log.info(
                "adaptive: %d -> %d turns from update %d: %s",
                last.before,
                last.after,
                last.step,
                last.reason,
            )
        return horizon

    def decisions(self, history: Sequence[Mapping[str, float]]) -> list[Decision]:
        """Every change of horizon `history` leads to, with its reason, in order."""
        return self.replay(history)[1]

    def horizons(self, history: Sequence[Mapping[str, float]]) -> list[int]:
        """The horizon of updates 0 .. len(history), as `max_turns` gives them."""
        horizon, changes = self.config.start, {d.step: d.after for d in self.decisions(history)}
        out = []
        for step in range(len(history) + 1):
            horizon = changes.get(step, horizon)
            out.append(horizon)
        return out

    def replay(self, history: Sequence[Mapping[str, float]]) -> tuple[int, list[Decision]]:
        """The horizon after `history` and the decisions on the way (a fresh replay each call)."""
        c = self.config
        horizon, decisions = c.start, []
        here: list[float] = []  # the metric at the current horizon, oldest first
        best = -math.inf  # best moving average at the current horizon
        for i, metrics in enumerate(history):
            here.append(self._value(metrics, i))
            if c.shrink and here[-1] < c.metric_floor:
                raise ValueError(
                    f"adaptive scheduler: update {i} has {c.metric} = {here[-1]:.4g}, below "
                    f"scheduler.metric_floor ({c.metric_floor:g}); a collapse is measured from "
                    "that floor, so set it to the metric's lowest value (e.g. -1 for rewards "
                    "in [-1, 1])"
                )
            if len(here) >= c.window:
                best = max(best, _mean(here[-c.window :]))
            change = self._decide(horizon, here, best)
            if change is not None:
                decisions.append(Decision(i + 1, horizon, *change))
                horizon, here, best = change[0], [], -math.inf
        return horizon, decisions

    def _value(self, metrics: Mapping[str, float], index: int) -> float:
        if self.config.metric not in metrics:
            raise ValueError(
                f"adaptive scheduler: update {index} has no {self.config.metric!r} in its "
                f"metrics (scheduler.metric); it has {sorted(metrics)[:8]}"
            )
        return float(metrics[self.config.metric])

    def _decide(self, horizon: int, here: list[float], best: float) -> tuple[int, str] | None:
        """(new horizon, reason) after the latest update at `horizon`, or None to stay."""
        c, w = self.config, self.config.window
        if c.shrink and len(here) >= w and horizon > c.min_turns:
            now, floor = _mean(here[-w:]), c.metric_floor
            # a fall measured from the floor, not a ratio to 0: with floor 0 this is the
            # original `now < fraction * best`, bit for bit (x - 0.0 == x)
            if now - floor < c.collapse_fraction * (best - floor):
                bound = f"{c.collapse_fraction:g} x best {best:.4g}"
                if floor:
                    bound = f"{floor:g} + {c.collapse_fraction:g} x (best {best:.4g} - {floor:g})"
                return self._shrunk(horizon), (
                    f"collapse: mean {c.metric} over the last {w} updates {now:.4g} < "
                    f"{bound} at {horizon} turns"
                )
        if len(here) >= c.patience and horizon < c.max_turns:
            now, before = _mean(here[-w:]), _mean(here[-2 * w : -w])
            if now - before < c.threshold:
                return self._grown(horizon), (
                    f"plateau: mean {c.metric} over the last {w} updates {now:.4g}, "
                    f"over the {w} before {before:.4g} (rise {now - before:+.4g} < "
                    f"{c.threshold:g}) after {len(here)} updates at {horizon} turns"
                )
        return None

    def _grown(self, horizon: int) -> int:
        factor, by = self.config.grow_factor, self.config.grow_by
        # round() first: 10 * 1.1 is 11.000000000000002, which must stay 11
        bigger = max(horizon + 1, math.ceil(round(horizon * factor, 9))) if factor else horizon + by
        return min(bigger, self.config.max_turns)

    def _shrunk(self, horizon: int) -> int:
        factor, by = self.config.grow_factor, self.config.grow_by
        smaller = (
            min(horizon - 1, math.floor(round(horizon / factor, 9))) if factor else horizon - by
        )
        return max(smaller, self.config.min_turns)


@hookimpl
def agentgym_register_schedulers(register: Register) -> None:
    """Register `adaptive`."""
    register("adaptive", AdaptiveScheduler, config=AdaptiveConfig)
