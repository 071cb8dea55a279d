"""Tables and curves of the results harness, from the kept JSON results only.

Numbers are means over seeds with a 95% interval (Student's t over the
seeds) and the min-max range beside them; arms named in a scenario's
`compare` get their paired difference per seed (same seed, same starting
model) with its interval. A missing run is named, never filled in. The
curves smooth training success with a moving average (its window is printed)
before the drop from the running best is measured, so one unlucky batch does
not count as instability.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from benchmarks.harness.cpu_share import SHARED_ABOVE
from benchmarks.harness.spec import Scenario
from benchmarks.harness.stats import MIN_SEEDS_FOR_A_VERDICT, half_width

SMOOTH = 10
"""Updates in the moving average of training success (curves and the drop measure)."""


SHARED_NOTE = (
    "\\* Some of these runs overlapped another kept run (by start time and wall time) or "
    "other work (their JSON's `machine.shared` says what, or `machine.others_cpu_share`, "
    "measured, says other processes took over a tenth of the CPUs), so their training time is "
    "not an idle-machine figure. Their scores do not depend on it (the preamble says how "
    "that was checked)."
)


OVERLAP_SLACK = timedelta(seconds=60)
"""Overlap ignored: start times are kept to the second, and a sweep's next run starts at once."""


def load_results(data: Path, scenario: str) -> list[dict[str, Any]]:
    """Every kept result of a scenario (smoke runs are not results)."""
    folder = data / scenario
    results = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    return [r for r in results if not r.get("smoke")]


def overlapping(results: Iterable[dict[str, Any]]) -> set[tuple[str, str, int]]:
    """(scenario, arm, seed) of every run that shared the machine.

    A run shared it when its time span crossed another kept run's, when its JSON says
    other work of ours ran beside it (`machine.shared`), or when other processes took more
    than `SHARED_ABOVE` of the CPUs while it ran (`machine.others_cpu_share`, measured by
    `cpu_share.CpuShare`). Its wall time is then not an
    idle-machine figure. Its scores stand: the runs are synchronous and seeded, so sharing
    slows them only.
    """
    spans, shared = [], set()
    for r in results:
        conditions = r.get("machine", {})
        if conditions.get("shared") or (conditions.get("others_cpu_share") or 0) > SHARED_ABOVE:
            shared.add(_key(r))
        if "started" not in r:  # written by hand (tests): it cannot be placed in time
            continue
        start = datetime.fromisoformat(r["started"])
        spans.append((start, start + timedelta(seconds=r["wall_seconds"]), _key(r)))
    spans.sort()
    for i, (_, end, key) in enumerate(spans):
        for later_start, _, other in spans[i + 1 :]:
            if later_start >= end - OVERLAP_SLACK:
                break
            shared |= {key, other}
    return shared


def _key(result: dict[str, Any]) -> tuple[str, str, int]:
    return result["scenario"], result["arm"], result["seed"]


def moving_average(values: Sequence[float], window: int = SMOOTH) -> list[float]:
    """Trailing mean over up to `window` values (shorter at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def largest_drop(values: Sequence[float]) -> float:
    """The largest fall below the running best (0 when it never falls)."""
    best, drop = float("-inf"), 0.0
    for value in values:
        best = max(best, value)
        drop = max(drop, best - value)
    return drop


def spread(values: Iterable[float]) -> str:
    """`mean ± 95% half-width (min-max)` with three decimals, or `-` when there is nothing."""
    values = list(values)
    if not values:
        return "-"
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.3f}"
    interval = f"{mean:.3f} ± {half_width(values):.3f}"
    return f"{interval} ({min(values):.3f}-{max(values):.3f})"


def paired_table(scenario: Scenario, results: list[dict[str, Any]]) -> str:
    """Per `compare` pair and evaluation: mean difference over shared seeds, its interval, verdict.

    An interval that holds 0 says "no difference shown"; one seed says nothing.
    """
    by_seed = _by_seed(results)
    header = ["difference (same seed, same start)", *scenario.evals, "seeds"]
    rows = [header, ["---"] * len(header)]
    for first, others in scenario.compare.items():
        for other in others:
            seeds = _shared_seeds(by_seed, first, other)
            if not seeds:
                continue
            differences = _paired(scenario, by_seed, first, other, seeds)
            row = [_pair_label(scenario, first, other)]
            row += [_difference(differences[split]) for split in scenario.evals]
            rows.append([*row, ", ".join(map(str, seeds))])
    return _markdown(rows) if len(rows) > 2 else ""


def _by_seed(results: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(r["arm"], r["seed"]): r for r in results}


def _shared_seeds(by_seed: dict[tuple[str, int], Any], first: str, other: str) -> list[int]:
    return sorted(s for a, s in by_seed if a == first and (other, s) in by_seed)


def _paired(
    scenario: Scenario,
    by_seed: dict[tuple[str, int], dict[str, Any]],
    first: str,
    other: str,
    seeds: list[int],
) -> dict[str, list[float]]:
    """Per evaluation split: `first` minus `other` seed by seed (a missing value is left out)."""
    differences = {}
    for split in scenario.evals:
        pairs = [
            (
                _metric(by_seed[first, s], split, scenario.metric),
                _metric(by_seed[other, s], split, scenario.metric),
            )
            for s in seeds
        ]
        differences[split] = [a - b for a, b in pairs if a is not None and b is not None]
    return differences


def _pair_label(scenario: Scenario, first: str, other: str) -> str:
    return f"{scenario.arms[first].label} - {scenario.arms[other].label}"


def summary_table(scenarios: Sequence[tuple[Scenario, list[dict[str, Any]]]]) -> str:
    """One row per `compare` pair of a ScalingInter arm: the paired difference of each evaluation,
    the env steps of the first arm over the second's, and each arm's mean largest drop
    with the paired difference of the drops (first - second, seed by seed).

    The table that answers "does ScalingInter match the best fixed horizon with fewer env
    steps, and is the long fixed horizon less stable?" in one place.
    """
    header = ["scenario", "first arm - second arm", "paired difference", "env steps"]
    header += [f"largest drop (MA{SMOOTH}): means, paired difference", "seeds"]
    rows = [header, ["---"] * len(header)]
    for scenario, results in scenarios:
        by_seed = _by_seed(results)
        for first, others in scenario.compare.items():
            if _scheduler(scenario, first) != "scaling_inter":
                continue  # other comparisons (SFT -> RL against SFT) stay in their section
            for other in others:
                seeds = _shared_seeds(by_seed, first, other)
                if not seeds or _scheduler(scenario, other) != "fixed":
                    continue  # RL after SFT against SFT alone is not a horizon comparison
                paired = _paired(scenario, by_seed, first, other, seeds)
                differences = "; ".join(f"{split}: {_difference(d)}" for split, d in paired.items())
                a = [by_seed[first, s] for s in seeds]
                b = [by_seed[other, s] for s in seeds]
                steps = sum(r["cost"]["env_steps"] for r in b)
                ratio = sum(r["cost"]["env_steps"] for r in a) / steps if steps else math.nan
                drops = f"{_mean(_drops(a)):.2f} / {_mean(_drops(b)):.2f}"
                if paired_drops := _paired_drops(a, b):
                    drops += f"; {_difference(paired_drops)}"
                label = _pair_label(scenario, first, other)
                row = [scenario.name, label, differences, f"{ratio:.2f}x", drops]
                rows.append([*row, ", ".join(map(str, seeds))])
    return _markdown(rows) if len(rows) > 2 else ""


def _scheduler(scenario: Scenario, arm: str) -> str | None:
    base = scenario.config.get("scheduler", {})
    return scenario.arms[arm].overrides.get("scheduler", base).get("name")


def _drops(results: list[dict[str, Any]]) -> list[float]:
    """Per run with RL updates: the largest drop of its smoothed training success."""
    return [_largest(c) for r in results if (c := _rl_curve(r, "success"))]


def _paired_drops(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> list[float]:
    """Seed by seed (the lists are in the same seed order), where both runs have RL updates:
    the first run's largest drop minus the second's."""
    pairs = zip(first, second, strict=True)
    curves = [(_rl_curve(x, "success"), _rl_curve(y, "success")) for x, y in pairs]
    return [_largest(c) - _largest(d) for c, d in curves if c and d]


def _largest(curve: list[float]) -> float:
    return largest_drop(moving_average(curve))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _difference(values: list[float]) -> str:
    if not values:
        return "-"
    mean = sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:+.3f} (one seed)"
    half = half_width(values)
    if len(values) < MIN_SEEDS_FOR_A_VERDICT:
        verdict = f"{len(values)} seeds, no verdict"
    else:
        verdict = "no difference shown" if abs(mean) <= half else "shown"
    return f"{mean:+.3f} ± {half:.3f}: {verdict}"


def _by_arm(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    arms: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        arms.setdefault(result["arm"], []).append(result)
    return arms


def _metric(
    result: dict[str, Any], split: str, metric: str, group: str | None = None
) -> float | None:
    record = result["evals"].get(split)
    if record is None:
        return None
    if group is not None:
        record = record["groups"].get(group)
        if record is None:
            return None
    return record.get(metric)


def main_table(
    scenario: Scenario,
    results: list[dict[str, Any]],
    shared: set[tuple[str, str, int]] = frozenset(),  # type: ignore[assignment]
) -> str:
    """One row per arm: each evaluation (mean, min-max over seeds), seeds, cost, stability.

    A training time averaged over a run in `shared` (see `overlapping`) gets a `*` and the
    table a footnote.
    """
    arms = _by_arm(results)
    splits = list(scenario.evals)
    header = ["arm", *(f"{split} {scenario.metric_label}" for split in splits)]
    header += ["seeds", "train s", "env steps", "sampled tokens", f"largest drop (MA{SMOOTH})"]
    rows = [header, ["---"] * len(header)]
    for name, arm in scenario.arms.items():
        runs = sorted(arms.get(name, []), key=lambda r: r["seed"])
        if not runs:
            continue
        row = [arm.label]
        for split in splits:
            values = [_metric(r, split, scenario.metric) for r in runs]
            row.append(spread(v for v in values if v is not None))
        row.append(", ".join(str(r["seed"]) for r in runs))
        trained = [r for r in runs if r["curve"]]
        seconds = _integer_spread(r["cost"]["train_seconds"] for r in trained)
        starred = any(_key(r) in shared for r in trained)
        row.append(seconds + " *" if starred else seconds)
        env_steps = _integer_spread(r["cost"]["env_steps"] for r in trained)
        row.append("not counted" if any(map(_expert_steps_uncounted, trained)) else env_steps)
        row.append(_integer_spread(r["cost"]["sampled_tokens"] for r in trained))
        row.append(" / ".join(f"{d:.2f}" for d in _drops(trained)) or "-")
        rows.append(row)
    table = _markdown(rows)
    if any(_key(r) in shared and r["curve"] for r in results):
        table += f"\n\n{SHARED_NOTE}"
    return table


def _rl_curve(result: dict[str, Any], key: str) -> list[float]:
    """`key` per RL update (SFT updates have no rollouts, hence no success or turns)."""
    return [p[key] for p in result["curve"] if key in p]


def _expert_steps_uncounted(result: dict[str, Any]) -> bool:
    """An SFT run kept before the expert's env steps were counted (its cost says 0)."""
    algorithm = result.get("config", {}).get("algorithm", {})
    made_data = algorithm.get("expert") is not None
    counted = any("expert_env_steps" in point for point in result["curve"])
    return made_data and not counted


def _integer_spread(values: Iterable[float]) -> str:
    values = list(values)
    if not values:
        return "-"
    return f"{sum(values) / len(values):,.0f}"


def group_table(scenario: Scenario, results: list[dict[str, Any]], split: str) -> str:
    """Per subtask (level, depth, task type): each arm's mean over seeds on `split`."""
    arms = _by_arm(results)
    groups = sorted({g for r in results for g in r["evals"].get(split, {}).get("groups", {})})
    present = [name for name in scenario.arms if arms.get(name)]
    rows = [
        ["group", *(scenario.arms[name].label for name in present)],
        ["---"] * (len(present) + 1),
    ]
    for group in groups:
        row = [group]
        for name in present:
            values = [_metric(r, split, scenario.metric, group) for r in arms[name]]
            values = [v for v in values if v is not None]
            row.append(f"{sum(values) / len(values):.2f}" if values else "-")
        rows.append(row)
    return _markdown(rows)


def missing_runs(scenario: Scenario, results: list[dict[str, Any]]) -> list[str]:
    """`arm seed N` for every run the scenario asks for and no result holds, and
    `arm seed N (no <eval>)` for a kept run that lacks some of its evaluations."""
    done = _by_seed(results)
    missing = []
    for name in scenario.arms:
        for seed in scenario.seeds:
            if (name, seed) not in done:
                missing.append(f"{name} seed {seed}")
            elif lacking := [e for e in scenario.evals if e not in done[name, seed]["evals"]]:
                missing.append(f"{name} seed {seed} (no {', '.join(lacking)})")
    return missing


def reruns_line(results: list[dict[str, Any]]) -> str:
    """Which kept runs were trained again (to add an evaluation), and whether they repeated
    the earlier run's curve and evaluations; empty when none was."""
    reruns = sorted((r for r in results if "rerun_of" in r), key=lambda r: (r["arm"], r["seed"]))
    if not reruns:
        return ""

    def name(r: dict[str, Any]) -> str:
        return f"{r['arm']} seed {r['seed']}"

    uncompared = [r for r in reruns if r["rerun_of"]["curve_equal"] is None]
    differ = [
        name(r)
        for r in reruns
        if r["rerun_of"]["curve_equal"] is False or not r["rerun_of"]["evals_equal"]
    ]
    repeated = sum(
        r["rerun_of"]["curve_equal"] is True and r["rerun_of"]["evals_equal"] for r in reruns
    )
    line = (
        f"Trained again to add an evaluation (the earlier checkpoints were not kept): "
        f"{len(reruns)} runs; {repeated} repeated their earlier training curve and "
        "evaluations exactly"
    )
    if uncompared:
        line += (
            "; the curves of these could not be compared (no training metric recorded in both "
            "runs): " + ", ".join(name(r) for r in uncompared)
        )
    if differ:
        line += "; these did not repeat, and show the new run's numbers: " + ", ".join(differ)
    return line + "."


def _markdown(rows: list[list[str]]) -> str:
    return "\n".join("| " + " | ".join(str(cell) for cell in row) + " |" for row in rows)


def plot(scenario: Scenario, results: list[dict[str, Any]], out: Path) -> Path:
    """Training success and turns per update (band over seeds), and the evaluation before/after."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = _by_arm(results)
    fig, (success, turns, evals) = plt.subplots(1, 3, figsize=(16, 5.2))
    for name, arm in scenario.arms.items():
        runs = [r for r in arms.get(name, []) if _rl_curve(r, "success")]
        if not runs:
            continue
        for axis, key in ((success, "success"), (turns, "turns")):
            line = _band(axis, runs, key, arm.label)
            for boundary in arm.stage_boundaries:
                axis.axvline(boundary, color=line.get_color(), linestyle=":", linewidth=1)
    success.set(title=f"training success (MA{SMOOTH}, band: min-max over seeds)", xlabel="update")
    turns.set(title="turns per episode (training)", xlabel="update")
    _eval_bars(evals, scenario, arms)
    for axis in (success, turns):
        axis.grid(alpha=0.3)
    fig.suptitle(scenario.title)
    # one legend for both line panels, under them: inside a panel it hides the curves
    handles, labels = success.get_legend_handles_labels()
    rows = -(-len(labels) // 3)
    bottom = 0.01 + 0.04 * rows
    if handles:
        fig.legend(
            handles, labels, loc="lower center", ncol=3, fontsize=8, bbox_to_anchor=(0.34, 0.0)
        )
    fig.tight_layout(rect=(0, bottom, 1, 1))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _band(axis: Any, runs: list[dict[str, Any]], key: str, label: str) -> Any:
    curves = [_rl_curve(r, key) for r in runs]
    length = min(len(c) for c in curves)
    series = [moving_average(c[:length]) for c in curves]
    steps = list(range(1, length + 1))
    mean = [sum(column) / len(column) for column in zip(*series, strict=True)]
    seeds = f"{len(runs)} seed" + ("" if len(runs) == 1 else "s")
    (line,) = axis.plot(steps, mean, label=f"{label} ({seeds})")
    lows = [min(column) for column in zip(*series, strict=True)]
    highs = [max(column) for column in zip(*series, strict=True)]
    axis.fill_between(steps, lows, highs, color=line.get_color(), alpha=0.2)
    return line


def _eval_bars(axis: Any, scenario: Scenario, arms: dict[str, list[dict[str, Any]]]) -> None:
    """Each arm's held-out score per evaluation split: mean bar, min-max whisker over seeds."""
    names = [name for name in scenario.arms if arms.get(name)]
    splits = list(scenario.evals)
    width = 0.8 / len(splits)
    for offset, split in enumerate(splits):
        for index, name in enumerate(names):
            values = [
                v for r in arms[name] if (v := _metric(r, split, scenario.metric)) is not None
            ]
            if not values:
                continue
            mean = sum(values) / len(values)
            x = index - 0.4 + width * (offset + 0.5)
            whisker = [[mean - min(values)], [max(values) - mean]]
            color = f"C{offset}"
            axis.bar(
                x,
                mean,
                width,
                yerr=whisker,
                capsize=3,
                color=color,
                label=split if index == 0 else None,
            )
    axis.set_xticks(
        range(len(names)), [scenario.arms[n].label for n in names], rotation=20, fontsize=8
    )
    axis.set(title=f"held-out {scenario.metric_label}, before (untrained) and after", ylim=(0, 1))
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3, axis="y")
