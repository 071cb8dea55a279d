"""GGUF files as Hugging Face folders: `agentgym model import-gguf FILE --out DIR`.

A GGUF file holds a model's weights (often quantized), its config and its
tokenizer, chat template included. transformers reads it (`gguf_file=`,
with the `gguf` package) and dequantizes the weights, but refuses to save
the model it loaded (the model stays marked as quantized). So the import
loads the file once, moves its weights into a plain model built from the
same config, and saves that: safetensors, config, tokenizer with its chat
template, and a `generation_config.json` with the file's special tokens and
no sampling settings. `IMPORT_RECORD` beside them names the source file, its
sha256 and its quantization, so a result can say which file it came from.

The weights are the dequantized values, exactly: a 4-bit file imported as
float32 is the model llama.cpp runs, not the checkpoint it was quantized from.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IMPORT_RECORD = "agentgym_import.json"
"""What an imported folder came from (source file, sha256, quantization, architecture)."""

DTYPES = ("float32", "bfloat16", "float16")


class GGUFImportError(ValueError):
    """The file cannot become a Hugging Face folder; the message says why and what to do."""


@dataclass(frozen=True)
class GGUFInfo:
    """What a GGUF file's header says, read without loading its tensors."""

    path: Path
    architecture: str
    tensors: int
    quantization: str
    """`general.file_type` by llama.cpp's name (`MOSTLY_Q4_1` -> `Q4_1`), or the most common
    tensor type when the header has none."""
    tensor_types: dict[str, int]
    name: str | None

    @property
    def vocab_only(self) -> bool:
        """A tokenizer with no weights (llama.cpp's `ggml-vocab-*.gguf`)."""
        return self.tensors == 0


def read_info(path: str | Path) -> GGUFInfo:
    """The header of a GGUF file.

    Raises:
        GGUFImportError: not a GGUF file, or the `gguf` package is missing.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no GGUF file {path}")
    reader_class = _gguf().GGUFReader
    try:
        reader = reader_class(str(path))
    except (ValueError, OSError) as error:
        raise GGUFImportError(f"{path} is not a GGUF file: {error}") from None
    fields = reader.fields

    def value(key: str) -> Any:
        field = fields.get(key)
        return None if field is None else field.contents()

    types = Counter(tensor.tensor_type.name for tensor in reader.tensors)
    return GGUFInfo(
        path=path,
        architecture=str(value("general.architecture") or "unknown"),
        tensors=len(reader.tensors),
        quantization=_quantization(value("general.file_type"), types),
        tensor_types=dict(types),
        name=value("general.name"),
    )


def _quantization(file_type: Any, types: Counter[str]) -> str:
    if file_type is not None:
        try:
            return _gguf().LlamaFileType(int(file_type)).name.removeprefix("MOSTLY_")
        except ValueError:
            pass
    return types.most_common(1)[0][0] if types else "none"


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise GGUFImportError(
            "reading GGUF files needs the gguf package: pip install 'agentgym-core[gguf]'"
        ) from None
    return gguf


def sha256(path: str | Path) -> str:
    """The file's sha256, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def supported_architectures() -> list[str]:
    """Model architectures transformers' GGUF loader converts."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return [a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ("general", "tokenizer")]


def import_gguf(
    file: str | Path, out: str | Path, *, dtype: str = "float32", tokenizer_only: bool = False
) -> Path:
    """Write `file` as a Hugging Face folder at `out` (made, or replaced if it was an import).

    Args:
        file: a GGUF file.
        out: the folder to write.
        dtype: the dtype of the saved weights (the dequantized values, rounded to it).
        tokenizer_only: write only the tokenizer (the one way to import a vocab-only file).

    Raises:
        GGUFImportError: a vocab-only file without `tokenizer_only`, an architecture
            transformers cannot convert, or an `out` that holds something else.
    """
    if dtype not in DTYPES:
        raise GGUFImportError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    info = read_info(file)
    if info.vocab_only and not tokenizer_only:
        raise GGUFImportError(
            f"{info.path.name} is vocab-only: a tokenizer with no weights "
            f"({info.architecture} vocabulary); import it with --tokenizer-only"
        )
    if not tokenizer_only and info.architecture not in supported_architectures():
        raise GGUFImportError(
            f"{info.path.name} is a {info.architecture!r} model, which transformers' GGUF "
            f"loader cannot convert (it converts {', '.join(supported_architectures())})"
        )
    out = Path(out)
    _make_room(out)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tokenizer = _load_tokenizer(info)
    tokenizer.save_pretrained(tmp)
    if not tokenizer_only:
        _save_model(info, tmp, dtype)
    record = {
        "source": info.path.name,
        "sha256": sha256(info.path),
        "bytes": info.path.stat().st_size,
        "architecture": info.architecture,
        "quantization": info.quantization,
        "tensor_types": info.tensor_types,
        "name": info.name,
        "dtype": None if tokenizer_only else dtype,
        "tokenizer_only": tokenizer_only,
    }
    (tmp / IMPORT_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def read_record(folder: str | Path) -> dict[str, Any] | None:
    """The import record of a folder `import_gguf` wrote, or None."""
    path = Path(folder) / IMPORT_RECORD
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def _make_room(out: Path) -> None:
    """Refuse to overwrite a folder that is not an earlier import."""
    if out.exists() and any(out.iterdir()) and read_record(out) is None:
        raise GGUFImportError(
            f"{out} exists and is not a folder agentgym imported (no {IMPORT_RECORD}); "
            "choose an empty or new --out"
        )


def _load_tokenizer(info: GGUFInfo) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(info.path.parent), gguf_file=info.path.name)
    except (ValueError, KeyError, NotImplementedError) as error:
        raise GGUFImportError(
            f"transformers cannot read the tokenizer of {info.path.name} "
            f"({info.architecture}): {error}"
        ) from None


def _save_model(info: GGUFInfo, folder: Path, dtype: str) -> None:
    """The dequantized weights as a plain model (save_pretrained refuses the GGUF-loaded one)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    try:
        loaded = AutoModelForCausalLM.from_pretrained(
            str(info.path.parent), gguf_file=info.path.name, dtype=torch.float32
        )
    except (ValueError, KeyError, NotImplementedError) as error:
        raise GGUFImportError(
            f"transformers cannot convert {info.path.name} ({info.architecture}): {error}"
        ) from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = ""
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.to(getattr(torch, dtype))
    plain.config.dtype = dtype
    special = {
        key: getattr(loaded.generation_config, key, None)
        for key in ("bos_token_id", "eos_token_id", "pad_token_id")
    }
    # only the special tokens: sampling settings belong to the run, not to the checkpoint
    plain.generation_config = GenerationConfig(
        **{k: v for k, v in special.items() if v is not None}
    )
    plain.save_pretrained(folder)
