"""`agentgym serve-env NAME`: the command line of the env server."""

from __future__ import annotations

import argparse

from agentgym_core.serve.runner import DEFAULT_HOST


def cmd_serve_env(args: argparse.Namespace) -> int:
    """Serve environment `args.env` over AgentGym's protocol (or OpenEnv's) until interrupted."""
    from agentgym_core.env_options import parse_options, plugin_host
    from agentgym_core.serve.runner import build_app, serve

    try:
        import uvicorn  # noqa: F401

        import agentgym_core.serve.app  # noqa: F401 - imports fastapi
    except ImportError as error:  # fastapi/uvicorn are the optional `serve` extra
        raise SystemExit(
            f"agentgym serve-env needs {error.name}: pip install 'agentgym-core[serve]'"
        ) from None

    host = plugin_host()
    openenv = args.protocol == "openenv"
    if openenv and args.strict:
        raise SystemExit("agentgym serve-env: --strict is for --protocol agentgym only")
    app = build_app(
        host.registry,
        args.env,
        parse_options(args.env_option),
        env_option_pairs=args.env_option,
        protocol=args.protocol,
        step_latency_s=args.step_latency_ms / 1000,
        idle_timeout_s=args.idle_timeout,
        max_sessions=args.max_sessions,
        threads=args.threads,
        env_timeout_s=args.env_timeout,
        **({} if openenv else {"strict": args.strict}),
    )
    if openenv:
        said = "OpenEnv protocol: WebSocket sessions on /ws, /reset /step /state /schema"
    else:
        mode = "strict status codes" if args.strict else "answers as AgentGym's server"
        said = f"AgentGym protocol, Family A, {mode}"
    print(
        f"serving {args.env} on http://{args.host}:{args.port} "
        f"({said}; OpenAPI at /docs and /openapi.json)",
        flush=True,
    )
    serve(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `serve-env` to the `agentgym` subcommands."""
    serve = sub.add_parser(
        "serve-env",
        help="serve an installed environment over AgentGym's HTTP protocol (or OpenEnv's)",
    )
    serve.add_argument("env", help="registered environment name (see `agentgym plugins`)")
    serve.add_argument(
        "--host", default=DEFAULT_HOST, help="interface to bind (default loopback only)"
    )
    serve.add_argument("--port", type=int, default=36001)
    serve.add_argument("-o", "--env-option", action="append", help="env config key=value")
    serve.add_argument(
        "--idle-timeout", type=float, default=600.0, help="close sessions idle this many seconds"
    )
    serve.add_argument("--max-sessions", type=int, default=1024, help="open sessions at most")
    serve.add_argument("--threads", type=int, default=8, help="environment calls at once")
    serve.add_argument(
        "--env-timeout", type=float, default=300.0, help="seconds one env call may take (504)"
    )
    serve.add_argument(
        "--step-latency-ms",
        type=float,
        default=0.0,
        help="add this many ms to every reset and step (rehearse a slow env: pools, timeouts)",
    )
    serve.add_argument(
        "--strict",
        action="store_true",
        help="errors as HTTP status codes (404 unknown id, 409 not reset or done, 422, 500) "
        'instead of AgentGym\'s HTTP 200 {"error": ...}; /close of an unknown id is 404',
    )
    serve.add_argument(
        "--protocol",
        choices=["agentgym", "openenv"],
        default="agentgym",
        help="agentgym: AgentGym's HTTP protocol (default); openenv: OpenEnv's, sessions on "
        "/ws (TRL, SkyRL), see docs/openenv.md",
    )
    serve.add_argument("--log-level", default="info", help="uvicorn log level")
    serve.set_defaults(func=cmd_serve_env)
