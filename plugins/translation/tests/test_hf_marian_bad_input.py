"""Importing a directory that is not a usable Marian model: a clear error naming the
file and the field, and nothing left where the run directory was to be written."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from marian_models import marian_directory

from seqtrans.plugin import DataError
from seqtrans_translation.hf_marian import FORMAT as MARIAN_FORMAT

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def marian(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return marian_directory(tmp_path_factory.mktemp("marian") / "hf", d_model=16, layers=1, train_steps=0)


class _Payload:
    """Pickled code: unpickling it would create the file it names."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., object], tuple[str, str]]:
        return open, (self.marker, "w")


def _edit_json(name: str, **changes: object) -> Callable[[Path], None]:
    def edit(directory: Path) -> None:
        data = json.loads((directory / name).read_text(encoding="utf-8"))
        data.update(changes)
        (directory / name).write_text(json.dumps(data), encoding="utf-8")

    return edit


def _pickled_code(directory: Path) -> None:
    (directory / "model.safetensors").unlink()
    torch.save({"weights": _Payload(str(directory / "EXECUTED"))}, directory / "pytorch_model.bin")


def _extra_vocab_symbol(directory: Path) -> None:
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    vocab["extra"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")


def _truncated_weights(directory: Path) -> None:
    data = (directory / "model.safetensors").read_bytes()
    (directory / "model.safetensors").write_bytes(data[: len(data) // 2])


CASES = {
    "not marian": (
        _edit_json("config.json", model_type="bart"),
        r"config\.json: field 'model_type' is 'bart'",
    ),
    "no config": (lambda d: (d / "config.json").unlink(), r"config\.json: missing"),
    "no source.spm": (lambda d: (d / "source.spm").unlink(), r"source\.spm: missing"),
    "no tokenizer config": (
        lambda d: (d / "tokenizer_config.json").unlink(),
        r"tokenizer_config\.json: missing",
    ),
    "no weights": (lambda d: (d / "model.safetensors").unlink(), r"model\.safetensors: missing"),
    "bad spm": (
        lambda d: (d / "target.spm").write_bytes(b"not a model"),
        r"target\.spm: not a sentencepiece",
    ),
    "vocabulary of another model": (
        _extra_vocab_symbol,
        r"vocab\.json: holds \d+ symbols, but config\.json's "
        r"field 'vocab_size'",
    ),
    "activation": (
        _edit_json("config.json", activation_function="gelu_new"),
        r"config\.json: field 'activation_function' is 'gelu_new'",
    ),
    "pre-norm": (_edit_json("config.json", normalize_before=True), r"config\.json: field 'normalize_before'"),
    "separate vocabularies": (
        _edit_json("config.json", share_encoder_decoder_embeddings=False),
        r"field 'share_encoder_decoder_embeddings'",
    ),
    "decoder start": (
        _edit_json("config.json", decoder_start_token_id=5),
        r"config\.json's field 'decoder_start_token_id' \(5\) is neither the id of '<pad>'",
    ),
    "shape": (
        _edit_json("config.json", encoder_ffn_dim=64, decoder_ffn_dim=64),
        r"model\.safetensors: tensor 'model\.encoder\.layers\.0\.fc1\.weight' has shape",
    ),
    "truncated": (
        _truncated_weights,
        r"model\.safetensors: tensor '[^']*': its byte range .* does not fit the file",
    ),
    "pickled code": (_pickled_code, r"pytorch_model\.bin: is a pickle, and loading a pickle can run"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_model_directories_are_refused_naming_file_and_field(
    marian: Path, tmp_path: Path, case: str
) -> None:
    damage, message = CASES[case]
    directory = tmp_path / "hf"
    shutil.copytree(marian, directory)
    damage(directory)
    with pytest.raises(DataError, match=message):
        MARIAN_FORMAT.import_model(directory, out=tmp_path / "runs" / "run")
    assert not (directory / "EXECUTED").exists()
    assert not (tmp_path / "runs" / "run").exists()
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_an_existing_run_directory_is_not_overwritten(marian: Path, tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "keep").write_text("x")
    with pytest.raises(DataError, match="exists"):
        MARIAN_FORMAT.import_model(marian, out=tmp_path / "run")
    assert (tmp_path / "run" / "keep").read_text() == "x"


def test_a_failure_while_writing_leaves_nothing(marian: Path, tmp_path: Path, monkeypatch) -> None:
    from seqtrans.training import checkpoint  # internal: a checkpoint written as the engine writes one

    def fail(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint, "save_atomic", fail)
    with pytest.raises(OSError, match="disk full"):
        MARIAN_FORMAT.import_model(marian, out=tmp_path / "run")
    assert list(tmp_path.iterdir()) == []


def test_an_allowed_pickle_is_still_read_as_weights_only(marian: Path, tmp_path: Path) -> None:
    """--allow-pickle reads a plain pickled state dict, never the code a pickle may hold."""
    directory = tmp_path / "hf"
    shutil.copytree(marian, directory)
    _pickled_code(directory)
    with pytest.raises(DataError, match=r"pytorch_model\.bin: not a plain weight file: it holds pickled"):
        MARIAN_FORMAT.import_model(directory, out=tmp_path / "run", allow_pickle=True)
    assert not (directory / "EXECUTED").exists() and not (tmp_path / "run").exists()
