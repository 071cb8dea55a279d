"""The paper's experiment in miniature: untrained vs fixed short, fixed long and ScalingInter-RL.

    python benchmarks/results.py --scenario babyai                 # every arm, the scenario's seeds
    python benchmarks/results.py --scenario babyai --seeds 0 --arms fixed-short
    python benchmarks/results.py --scenario all                    # every scenario
    python benchmarks/results.py --report                          # rewrite README and PNGs only
    python benchmarks/results.py --scenario babyai --smoke         # 2 updates per arm, one seed
    python benchmarks/results.py --scenario babyai --restarts 3    # resumed if the kernel kills it

Each finished (scenario, arm, seed) is kept as JSON in `benchmarks/results/data/`
and skipped when run again, so a sweep resumes where it stopped. An evaluation
added to a scenario's YAML later is run on each kept run's final checkpoint
(under `runs/results/`), or, where that is gone, the run is trained again and
its JSON says whether it repeated the kept curve and scores. After the runs,
`benchmarks/results/README.md` and `benchmarks/results/<scenario>.png` are
written from every kept result. The scenarios are the YAML files in
`benchmarks/results/configs/`. Plots need matplotlib: `pip install -e '.[bench]'`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.harness.readme import write_report  # noqa: E402
from benchmarks.harness.runner import Paths, run_arm  # noqa: E402
from benchmarks.harness.spec import load_scenario, scenario_names  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--scenario", default="all", help="a scenario name, or all")
    parser.add_argument("--seeds", type=int, nargs="*", help="default: the scenario's seeds")
    parser.add_argument("--arms", nargs="*", help="default: every arm (untrained first)")
    parser.add_argument(
        "--smoke", action="store_true", help="2 updates per arm, one seed, kept apart"
    )
    parser.add_argument("--report", action="store_true", help="only rewrite the README and plots")
    parser.add_argument("--data", type=Path, help="kept results (benchmarks/results/data)")
    parser.add_argument("--work", type=Path, help="models, checkpoints (runs/results)")
    parser.add_argument("--out", type=Path, help="README.md and PNGs (benchmarks/results)")
    parser.add_argument(
        "--restarts",
        type=int,
        default=0,
        help="start the sweep again, up to this many times, when the kernel kills it (SIGKILL, "
        "as its out-of-memory killer does); it resumes where it stopped",
    )
    return parser.parse_args(argv)


def folders(args: argparse.Namespace) -> tuple[Path, Path, Path]:
    """Kept results, working files and report; a smoke run's go to a scratch folder unless told."""
    scratch = Path(tempfile.mkdtemp(prefix="agentgym-results-smoke-")) if args.smoke else None
    return (
        args.data or (scratch / "data" if scratch else RESULTS / "data"),
        args.work or (scratch / "work" if scratch else ROOT / "runs" / "results"),
        args.out or (scratch / "report" if scratch else RESULTS),
    )


def main(argv: list[str] | None = None) -> int:
    """Run what is asked and not kept yet, then write the report."""
    from agentgym_core.run.signals import exit_cleanly_on_sigterm

    exit_cleanly_on_sigterm()  # a stopped sweep still closes its envs (browsers, JVMs)
    args = parse_args(argv)
    if args.restarts > 0:
        from benchmarks.harness.supervise import child_command, supervise

        given = sys.argv[1:] if argv is None else argv
        return supervise(child_command([__file__, *given]), args.restarts)
    names = scenario_names() if args.scenario == "all" else [args.scenario]
    scenarios = [load_scenario(name) for name in names]
    args.data, args.work, args.out = folders(args)
    if not args.report:
        from agentgym_core.plugins import PluginHost

        host, paths = PluginHost(), Paths(args.data, args.work)
        for scenario in scenarios:
            seeds = args.seeds if args.seeds is not None else scenario.seeds
            seeds = seeds[:1] if args.smoke else seeds
            arms = args.arms or list(scenario.arms)
            for seed in seeds:
                for name in arms:
                    if name not in scenario.arms:
                        raise SystemExit(f"unknown arm {name!r}; arms: {', '.join(scenario.arms)}")
                    start = time.perf_counter()
                    result = run_arm(
                        scenario, scenario.arms[name], seed, paths, host, smoke=args.smoke
                    )
                    first = next(iter(result["evals"].values()), {})
                    print(
                        f"{scenario.name} {name} seed {seed}: "
                        f"{scenario.metric_label} {first.get(scenario.metric, float('nan')):.3f} "
                        f"({time.perf_counter() - start:.0f} s)",
                        flush=True,
                    )
    reported = scenarios if args.smoke else [load_scenario(n) for n in scenario_names()]
    written = write_report(reported, args.data, args.out, smoke=args.smoke)
    print(f"report: {written}")
    return 0


if __name__ == "__main__":
    if "--report" not in sys.argv:
        from agentgym_core.numerics import flush_subnormals

        flush_subnormals()  # this process is agentgym's own: before torch starts its threads
    sys.exit(main())
