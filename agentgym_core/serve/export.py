"""`agentgym export openenv NAME --out DIR`: what OpenEnv's tooling needs to publish an env.

Writes, for an installed environment: `openenv.yaml` (OpenEnv's manifest),
`pyproject.toml` (its `server` script, the env's distribution and agentgym),
`server/app.py` (the OpenEnv app, `agentgym serve-env --protocol openenv`'s),
a `Dockerfile` that installs the env package, and a README with the commands.
The env's options (`-o key=value`) are validated now and written into the app.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path
from typing import Any

from agentgym_core import __version__

PORT = 8000
"""OpenEnv's port convention (its manifest and Docker images)."""
TORCH = "torch==2.13.0"
"""The torch the image installs first, from PyTorch's CPU index (agentgym's core needs torch)."""


def export_openenv(
    registration: Any, options: dict[str, Any], out: Path, *, core_version: str = __version__
) -> list[Path]:
    """Write the publishable folder for `registration` (an env) into `out`; the files written."""
    name = registration.name
    package = f"openenv-agentgym-{name}".replace("_", "-")
    files = {
        "openenv.yaml": _manifest(name),
        "pyproject.toml": _pyproject(package, registration, core_version),
        "server/__init__.py": "",
        "server/app.py": _app(name, options),
        "Dockerfile": _dockerfile(name),
        "README.md": _readme(name, package, registration),
    }
    written = []
    for relative, text in files.items():
        path = out / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def _manifest(name: str) -> str:
    return textwrap.dedent(
        f"""\
        spec_version: 1
        name: {name}
        type: space
        runtime: fastapi
        app: server.app:app
        port: {PORT}
        """
    )


def _pyproject(package: str, registration: Any, core_version: str) -> str:
    dependencies = [
        f"agentgym-core[serve]>={core_version}",
        f"{registration.distribution}>={registration.version}",
        "openenv>=0.10.0",  # what OpenEnv's `validate` and `push` look for (was openenv-core)
    ]
    listed = "\n".join(f'    "{dependency}",' for dependency in dependencies)
    return (
        textwrap.dedent(
            f"""\
            [build-system]
            requires = ["setuptools>=69"]
            build-backend = "setuptools.build_meta"

            [project]
            name = "{package}"
            version = "{registration.version}"
            description = "agentgym's {registration.name} environment, served over OpenEnv"
            requires-python = ">=3.11"
            dependencies = [
            """
        )
        + listed
        + textwrap.dedent(
            """
            ]

            [project.scripts]
            server = "server.app:main"

            [tool.setuptools]
            packages = ["server"]
            """
        )
    )


def _app(name: str, options: dict[str, Any]) -> str:
    return textwrap.dedent(
        f'''\
        """OpenEnv's entry point for agentgym's `{name}` environment (written by agentgym export).

        The same app as `agentgym serve-env {name} --protocol openenv`: sessions on /ws,
        /reset, /step, /state, /schema, /metadata and /health.
        """

        from agentgym_core.env_options import plugin_host
        from agentgym_core.serve.runner import build_app, serve

        ENV = "{name}"
        OPTIONS = {json.dumps(options, sort_keys=True)}

        app = build_app(plugin_host().registry, ENV, OPTIONS, protocol="openenv")


        def main(host: str = "0.0.0.0", port: int = {PORT}) -> None:
            """Serve until interrupted (`uv run server`, `python -m server.app`)."""
            serve(app, host=host, port=port)


        if __name__ == "__main__":
            import argparse

            parser = argparse.ArgumentParser()
            parser.add_argument("--host", default="0.0.0.0")
            parser.add_argument("--port", type=int, default={PORT})
            args = parser.parse_args()
            main(args.host, args.port)
        '''
    )


def _dockerfile(name: str) -> str:
    return textwrap.dedent(
        f"""\
        # agentgym's {name} environment over OpenEnv's protocol (written by agentgym export).
        FROM python:3.11-slim
        WORKDIR /app/env
        COPY . /app/env
        # torch first, from the CPU index: an unpinned one pulls a multi-GB CUDA build
        RUN pip install --no-cache-dir {TORCH} --index-url https://download.pytorch.org/whl/cpu \\
         && pip install --no-cache-dir .
        EXPOSE {PORT}
        CMD ["python", "-m", "server.app", "--host", "0.0.0.0", "--port", "{PORT}"]
        """
    )


def _readme(name: str, package: str, registration: Any) -> str:
    return textwrap.dedent(
        f"""\
        # {name} over OpenEnv

        agentgym's `{name}` environment ({registration.distribution} {registration.version}),
        served over OpenEnv's protocol: multi-turn episodes in WebSocket sessions on `/ws`,
        and `/reset`, `/step`, `/state`, `/schema`, `/metadata`, `/health`.

        Run it here:

            pip install .
            python -m server.app --port {PORT}

        Or in Docker:

            docker build -t {package} .
            docker run -p {PORT}:{PORT} {package}

        Publish it with OpenEnv's tooling (`uv lock` first: `openenv validate` wants a lock file):

            uv lock
            openenv validate
            openenv push

        Play it from any OpenEnv client:

            from openenv.core import GenericEnvClient

            with GenericEnvClient(base_url="http://127.0.0.1:{PORT}").sync() as env:
                result = env.reset(split="test", index=0)     # or task_id=..., or seed=...
                result = env.step({{"text": result.observation["available_actions"][0]}})

        The action is `{{"text": ...}}`; the observation has `text`, `available_actions`,
        `task_id`, `task_group` and `metadata` (`success` once done); `GET /tasks?split=test`
        lists the task ids.
        """
    )


def cmd_export_openenv(args: argparse.Namespace) -> int:
    """Validate the env and its options, then write the folder."""
    from agentgym_core.env_options import parse_options, plugin_host, validate_env_options

    options = parse_options(args.env_option)
    registration, _ = validate_env_options(
        plugin_host().registry, args.env, options, args.env_option
    )
    out = Path(args.out)
    for path in export_openenv(registration, options, out):
        print(path)
    print(f"next: cd {out} && python -m server.app   (README.md: Docker, openenv push)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `export openenv` to the `agentgym` subcommands."""
    export = sub.add_parser("export", help="package an env for another ecosystem")
    kinds = export.add_subparsers(dest="target", required=True)
    openenv = kinds.add_parser(
        "openenv", help="a folder OpenEnv publishes: openenv.yaml, Dockerfile, server/app.py"
    )
    openenv.add_argument("env", help="registered environment name (see `agentgym plugins`)")
    openenv.add_argument("--out", required=True, help="folder to write")
    openenv.add_argument("-o", "--env-option", action="append", help="env config key=value")
    openenv.set_defaults(func=cmd_export_openenv)
