"""Terminal output: a training progress bar and plain-text tables.

The bar stays off when stderr is not a terminal (CI logs, `nohup`), where
tqdm's carriage returns turn into thousands of lines; MLflow has the numbers.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
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
    """

    def __init__(
        self,
        total_steps: int,
        initial: int = 0,
        *,
        enabled: bool = True,
        force: bool = False,
        file: IO[str] | None = None,
    ) -> None:
        stream = file if file is not None else sys.stderr
        is_tty = bool(getattr(stream, "isatty", lambda: False)())
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


def postfix_of(metrics: Mapping[str, Any]) -> dict[str, str]:
    """The `success`, `reward`, `horizon` entries found in `metrics`, formatted."""
    out: dict[str, str] = {}
    for label, names in POSTFIX_KEYS.items():
        value = next((metrics[n] for n in names if n in metrics), None)
        if value is not None:
            out[label] = f"{value:.0f}" if label == "horizon" else f"{value:.3f}"
    return out


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
