"""`agentgym config init`: a starter run config of an env, an algorithm and a scheduler.

The repository's `configs/` folder is in no wheel, so a new user starts here.
The file opens with the command that runs it, sets only the names, the model
and a few trainer numbers (plus any `key=value` given), and lists every other
option of its components and the common root options commented out, each
with its default and description. It is validated before it is written and
loaded back as `agentgym train` loads it, so what is written runs.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from agentgym_core.registry import Registry, options, yaml_value

COMPONENTS = {
    "env": "environment",
    "policy": "policy",
    "algorithm": "algorithm",
    "scheduler": "scheduler",
}
"""Config block -> registry kind, in the order a config writes them."""

ROOT_OPTIONS = {
    "rollout": ("max_context_tokens", "max_new_tokens", "concurrency"),
    "trainer": ("steps", "tasks_per_step", "group_size", "lr", "checkpoint_every", "eval_every"),
    "eval": ("split", "num_tasks", "max_turns"),
}
"""Root options a starter config shows; every other one is in the config reference."""

STARTER = {
    "trainer": {"steps": 100, "tasks_per_step": 8, "group_size": 8},
    "eval": {"split": "test"},
}
"""Root values a starter config writes out, so the numbers a first run changes are in view."""

WIDTH = 96


def starter_values(
    env: str,
    algorithm: str,
    scheduler: str,
    policy: str | None = None,
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """The values a starter config writes: names, model, trainer numbers, then `overrides`."""
    import yaml

    from agentgym_core.config.errors import ConfigError, Problem

    values: dict[str, Any] = {
        "run": {"name": f"{env}-{algorithm}"},
        "model": {"path": f"runs/models/{env}-tiny"},
        "env": {"name": env},
        **({"policy": {"name": policy}} if policy else {}),
        "algorithm": {"name": algorithm},
        "scheduler": {"name": scheduler},
        **{block: dict(keys) for block, keys in STARTER.items()},
    }
    problems = []
    for pair in overrides:
        key, sep, text = pair.partition("=")
        parts = key.split(".")
        if not sep or len(parts) < 2 or not all(parts):
            problems.append(Problem("", f"expected block.key=value, got {pair!r}"))
            continue
        node = values
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(text)
    if problems:
        raise ConfigError(problems, "the starter config")
    return values


def check_values(values: dict[str, Any], registry: Registry) -> None:
    """Raise ConfigError unless `values` make a valid config; a missing key says how to give it."""
    from agentgym_core.config.errors import ConfigError, Problem
    from agentgym_core.config.resolve import validate_dict

    try:
        validate_dict(values, registry)
    except ConfigError as error:
        problems = [
            Problem(p.path, _how_to_give(p.path, registry, values)) if _missing(p) else p
            for p in error.problems
        ]
        raise ConfigError(problems, "the starter config") from None


def _missing(problem: Any) -> bool:
    return problem.message == "missing required key" and problem.path.count(".") == 1


def _how_to_give(path: str, registry: Registry, values: Mapping[str, Any]) -> str:
    block, key = path.split(".")
    found = {o.name: o for o in _block_options(block, registry, values)}
    if key not in found:
        return f"missing required key: add {path}=VALUE"
    option = found[key]
    return f"missing required key: add {path}=<{option.type}> ({option.description})"


def _block_options(block: str, registry: Registry, values: Mapping[str, Any]) -> list[Any]:
    """The documented options of a block: its component's, or the root block's model's."""
    from agentgym_core.config.schema import AgentGymConfig

    if block in COMPONENTS:
        return options(registry.get(COMPONENTS[block], values[block]["name"]).config)
    model = AgentGymConfig.model_fields[block].annotation
    shown = ROOT_OPTIONS.get(block)
    return [o for o in options(model) if shown is None or o.name in shown]


def render(values: Mapping[str, Any], registry: Registry, command: str) -> str:
    """The YAML text: the command first, set values as keys, other options commented out."""
    env = values["env"]["name"]
    lines = [
        f"# {command}",
        "# Written by `agentgym config init`: the set keys, then every other option of the block",
        "# commented out, with its default. `agentgym plugins NAME` shows a plugin's options.",
        "# model.path: a Hugging Face checkpoint folder; to start from scratch, a tiny one:",
        f"#   agentgym model init --env {env} --out {values['model']['path']}",
    ]
    for block, set_here in values.items():
        lines.append(f"{block}:")
        documented = (
            _block_options(block, registry, values) if block not in ("run", "model") else []
        )
        written = set()
        if "name" in set_here:
            lines.append(f"  name: {yaml_value(set_here['name'])}")
            written.add("name")
        for option in documented:
            if option.name in set_here:
                lines.append(f"  {option.name}: {yaml_value(set_here[option.name])}")
                lines += _comment(option.description)
                written.add(option.name)
        for key, value in set_here.items():  # anything set that the documented list lacks
            if key not in written:
                lines.append(f"  {key}: {yaml_value(value)}")
        for option in documented:
            if option.name not in set_here:
                lines.append(f"  # {option.name}: {option.default}")
                lines += _comment(option.description)
        if block == "scheduler" and "policy" not in values:
            lines.append("# policy: {name: hf}   # the default generation backend, built in")
    return "\n".join(lines) + "\n"


def _comment(text: str) -> list[str]:
    """An option's description as indented comment lines under it."""
    return textwrap.wrap(text, WIDTH, initial_indent="  #   ", subsequent_indent="  #   ")


def write_starter_config(
    registry: Registry,
    out: Path,
    *,
    env: str,
    algorithm: str,
    scheduler: str,
    policy: str | None = None,
    overrides: Sequence[str] = (),
) -> Path:
    """Write the starter config to `out` (a new file) and load it back as `agentgym train` does.

    Raises:
        ConfigError: the components and `overrides` make no valid config (nothing written).
        RegistryError: a name no installed plugin registered.
        FileExistsError: `out` exists.
    """
    from agentgym_core.config.load import load_config

    if out.exists():
        raise FileExistsError(f"{out} exists; give --out a new file")
    values = starter_values(env, algorithm, scheduler, policy, overrides)
    check_values(values, registry)
    text = render(values, registry, f"agentgym train {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    try:
        load_config(out, [], registry)
    except Exception:
        out.unlink()  # what was checked did not load back: never leave a broken starter behind
        raise
    return out


def cmd_config_init(args: argparse.Namespace) -> int:
    """Write the starter config and say how to run it."""
    from agentgym_core.env_options import plugin_host

    out = write_starter_config(
        plugin_host().registry,
        Path(args.out),
        env=args.env,
        algorithm=args.algorithm,
        scheduler=args.scheduler,
        policy=args.policy,
        overrides=args.overrides,
    )
    steps = [f"agentgym train {out}"]
    model = f"runs/models/{args.env}-tiny"
    named = any(pair.startswith("model.path=") for pair in args.overrides)
    if not named and not Path(model).exists():
        steps.insert(0, f"agentgym model init --env {args.env} --out {model}   # a tiny model")
    print(f"config written to {out}")
    print("next: " + "\n      ".join(steps))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `config init` to the `agentgym` subcommands."""
    config = sub.add_parser("config", help="run configs").add_subparsers(
        dest="action", required=True
    )
    init = config.add_parser(
        "init",
        help="write a starter run config of an env, an algorithm and a scheduler (valid as "
        "written, every other option listed in comments)",
    )
    init.add_argument("--env", required=True, help="an installed environment (agentgym plugins)")
    init.add_argument("--algorithm", required=True, help="an installed algorithm, e.g. grpo")
    init.add_argument("--scheduler", required=True, help="an installed scheduler, e.g. fixed")
    init.add_argument("--policy", help="a generation backend (default: the built-in hf)")
    init.add_argument("--out", required=True, help="the YAML file to write (must not exist)")
    init.add_argument(
        "overrides",
        nargs="*",
        help="block.key=value to set, e.g. scheduler.max_turns=8 model.path=runs/models/x",
    )
    init.set_defaults(func=cmd_config_init)
