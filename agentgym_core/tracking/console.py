"""Terminal output: a training progress bar, a line per update, and plain-text tables.

The bar stays off when stderr is not a terminal (CI logs, `nohup`), where
tqdm's carriage returns turn into thousands of lines. The per-update lines go
to stdout either way (above the bar on a terminal), so a log says what each
update did; `agentgym train --quiet` turns them off.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from tqdm import tqdm

POSTFIX_KEYS = {
    "success": ("rollout/success_rate", "success_rate"),
    "reward": ("rollout/reward_mean", "mean_reward"),
    "horizon": ("rollout/horizon", "horizon"),
}
"""Postfix label -> metric names tried in order."""


class ProgressBar:
    """Update steps as a tqdm bar with success, reward and horizon in the postfix.

    Args:
        total_steps: the last step of the stage.
        initial: the step a resumed run starts at.
        enabled: False to show nothing.
        force: show the bar even when `file` is not a terminal.
        file: where to draw (stderr by default).
        lines: print `update_line` for each update to stdout, bar or no bar.
        label: the stage name the lines start with.
    """

    def __init__(
        self,
        total_steps: int,
        initial: int = 0,
        *,
        enabled: bool = True,
        force: bool = False,
        file: IO[str] | None = None,
        lines: bool = False,
        label: str = "",
    ) -> None:
        stream = file if file is not None else sys.stderr
        is_tty = bool(getattr(stream, "isatty", lambda: False)())
        self.total, self.label = total_steps, label
        self.lines = lines
        self.enabled = enabled and (force or is_tty)
        self._bar = tqdm(
            total=total_steps,
            initial=initial,
            unit="step",
            file=stream,
            dynamic_ncols=True,
            disable=not self.enabled,
        )

    def update(self, step: int, metrics: Mapping[str, Any] | None = None) -> None:
        """Move to `step` (steps done) and show the step's headline metrics."""
        if self.lines:
            tqdm.write(update_line(step, self.total, metrics or {}, self.label), file=sys.stdout)
        if not self.enabled:
            return
        postfix = postfix_of(metrics or {})
        if postfix:
            self._bar.set_postfix(postfix, refresh=False)
        self._bar.update(step - self._bar.n)

    def close(self) -> None:
        """Leave the bar on screen and release the line."""
        self._bar.close()

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class EpisodeProgress:
    """Episodes done out of the total and success so far, a line at most every `every_s`.

    A callback for `RolloutEngine.run(on_done=...)`: an evaluation of a real model
    runs for minutes, and a line (not a bar) says where it is in a log as on a terminal.
    The first line comes `every_s` in, so a short run prints none; once one has
    printed, the last episode prints one too. `turn` (for `on_turn`) counts env steps:
    episodes played side by side all end near the end, and the turns say it moves.
    """

    def __init__(
        self,
        total: int,
        label: str,
        *,
        every_s: float = 30.0,
        write: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total, self.label, self.every_s = total, label, every_s
        self.write = write or (lambda line: tqdm.write(line, file=sys.stderr))
        self.clock = clock
        self.start = self.last = clock()
        self.done = self.successes = self.env_errors = self.turns = 0
        self.printed = False

    def __call__(self, trajectory: Any) -> None:
        """Count one finished episode; print if due."""
        self.done += 1
        if getattr(trajectory, "error", None) is not None:
            self.env_errors += 1
        elif trajectory.success:
            self.successes += 1
        self._print_if_due(last=self.done == self.total)

    def turn(self) -> None:
        """Count one env step of any episode; print if due."""
        self.turns += 1
        self._print_if_due(last=False)

    def _print_if_due(self, last: bool) -> None:
        now = self.clock()
        if now - self.last >= self.every_s or (last and self.printed):
            self.last, self.printed = now, True
            self.write(self.line(now))

    def line(self, now: float) -> str:
        """`[eval] episodes 30/90  turns 912  success 0.433  env errors 0  95 s`."""
        scored = self.done - self.env_errors
        success = f"{self.successes / scored:.3f}" if scored else "-"
        return (
            f"[{self.label}] episodes {self.done}/{self.total}  turns {self.turns}  "
            f"success {success}  env errors {self.env_errors}  {now - self.start:.0f} s"
        )


def postfix_of(metrics: Mapping[str, Any]) -> dict[str, str]:
    """The `success`, `reward`, `horizon` entries found in `metrics`, formatted."""
    out: dict[str, str] = {}
    for label, names in POSTFIX_KEYS.items():
        value = next((metrics[n] for n in names if n in metrics), None)
        if value is not None:
            out[label] = f"{value:.0f}" if label == "horizon" else f"{value:.3f}"
    return out


LINE_KEYS = (
    ("horizon", "rollout/horizon", "{:.0f}"),
    ("success", "rollout/success_rate", "{:.3f}"),
    ("reward", "rollout/reward_mean", "{:.3f}"),
    ("turns", "rollout/turns_mean", "{:.1f}"),
    ("env errors", "rollout/env_errors", "{:.0f}"),
    ("loss", "train/loss", "{:.4f}"),
)
"""Label, metric and format of each field of an update line, in order; missing ones are left out."""


def update_line(step: int, total: int, metrics: Mapping[str, Any], label: str = "") -> str:
    """One update as a line: `[train] update 12/150  horizon 6  success 0.453 ... 9.1 s`."""
    parts = [f"[{label}] " if label else "", f"update {step}/{total}"]
    for name, key, fmt in LINE_KEYS:
        if metrics.get(key) is not None:
            parts.append(f"  {name} {fmt.format(metrics[key])}")
        if key == "rollout/env_errors" and metrics.get("rollout/env_errors_replayed"):
            # errors the update never saw: their episodes were played again after an outage
            parts.append(f" ({metrics['rollout/env_errors_replayed']:.0f} replayed)")
    if metrics.get("train/skipped"):
        parts.append("  (nothing to train on)")
    if metrics.get("step_seconds") is not None:
        parts.append(f"  {metrics['step_seconds']:.1f} s")
    return "".join(parts)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """Rows as an aligned plain-text table: numbers right, text left, floats to 3 decimals.

    Missing cells print `-`. Returns the header, a rule, and one line per row.
    """
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    numeric = [
        all(isinstance(row.get(c), int | float) or row.get(c) is None for row in rows)
        and any(row.get(c) is not None for row in rows)
        for c in columns
    ]

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(w) if num else v.ljust(w)
            for v, w, num in zip(values, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(list(columns)), rule, *(line(r) for r in cells)])
