"""`agentgym new env NAME --out DIR`: write a package for a third-party environment plugin.

The package is complete as written: `pip install -e 'DIR[test]'` makes
`agentgym plugins` list NAME, and its tests (the core's `check_environment` and pytest
fixtures) pass. It holds a toy game (guess the number) with train/test
splits, task groups, `valid_actions` and `expert_action`, to be replaced by
the author's own. The files are the templates under `templates/env/`, with
`{{name}}`, `{{package}}`, `{{distribution}}`, `{{Class}}` and
`{{core_requirement}}` filled in.
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from pathlib import Path

from agentgym_core import __version__

TEMPLATES = Path(__file__).parent / "templates"
NAME = re.compile(r"[a-z][a-z0-9_]*")
SUFFIX = ".tmpl"


class ScaffoldError(ValueError):
    """A name or an output folder `agentgym new` cannot use."""


def core_requirement(version: str = __version__) -> str:
    """The `agentgym-core` pin a plugin should declare: the API is stable within a minor version.

    Before 1.0 a minor release may change the API (`0.1.0` -> `agentgym-core>=0.1,<0.2`);
    from 1.0 on only a major one does (`1.2.0` -> `agentgym-core>=1.2,<2`).
    """
    major, minor = (int(part) for part in version.split(".")[:2])
    upper = f"0.{minor + 1}" if major == 0 else str(major + 1)
    return f"agentgym-core>={major}.{minor},<{upper}"


def check_name(name: str) -> str:
    """`name` if it can name an env, its package and its entry point; else ScaffoldError."""
    if not NAME.fullmatch(name) or keyword.iskeyword(name):
        raise ScaffoldError(
            f"env name {name!r} must be a lowercase Python identifier (a letter, then letters, "
            "digits or _), e.g. 'guess' or 'my_game'"
        )
    return name


def substitutions(name: str) -> dict[str, str]:
    """What each `{{key}}` of the templates becomes for env `name`."""
    return {
        "name": name,
        "package": f"agentgym_env_{name}",
        "distribution": f"agentgym-env-{name.replace('_', '-')}",
        "Class": "".join(part.capitalize() for part in name.split("_") if part),
        "core_requirement": core_requirement(),
    }


def _fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", value)
    left = re.search(r"\{\{\w+\}\}", text)
    if left:
        raise RuntimeError(f"template placeholder {left.group()} has no value")  # our bug
    return text


def new_env(name: str, out: Path) -> list[Path]:
    """Write the package of env `name` into `out` (absent or empty); returns the files written."""
    values = substitutions(check_name(name))
    if out.exists() and not out.is_dir():
        raise ScaffoldError(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()):
        raise ScaffoldError(f"{out} is not empty; give --out a new or empty folder")
    root = TEMPLATES / "env"
    written = []
    for template in sorted(root.rglob(f"*{SUFFIX}")):
        relative = _fill(str(template.relative_to(root)), values).removesuffix(SUFFIX)
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_fill(template.read_text(), values))
        written.append(path)
    return written


def cmd_new_env(args: argparse.Namespace) -> int:
    """Write the package and say what to do next."""
    out = Path(args.out or f"agentgym-env-{args.name.replace('_', '-')}")
    try:
        files = new_env(args.name, out)
    except ScaffoldError as error:
        print(f"agentgym: error: {error}", file=sys.stderr)
        return 2
    for path in files:
        print(f"  {path}")
    print(
        f"next: pip install -e '{out}[test]' && agentgym plugins   # lists {args.name}; "
        "[test]: pytest\n"
        f"      cd {out} && python -m pytest                 # the generated tests\n"
        "      agentgym docs writing-an-env                  # the guide, method by method"
    )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `new env` to the `agentgym` subcommands."""
    new = sub.add_parser("new", help="scaffold a plugin package").add_subparsers(
        dest="action", required=True
    )
    env = new.add_parser(
        "env",
        help="write a package for a third-party environment (a working toy env, its config, "
        "entry point, README and tests)",
    )
    env.add_argument("name", help="the env's registered name: a lowercase Python identifier")
    env.add_argument("--out", help="folder to write, new or empty (default: ./agentgym-env-NAME)")
    env.set_defaults(func=cmd_new_env)
