"""``seqtrans import hf`` on damaged or foreign model directories: each is refused with
a message naming the file and the field or tensor, and nothing is written."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hf_models import edit_config, hf_directory

from seqtrans import load
from seqtrans.plugin import ConfigError, DataError
from seqtrans_translation.hf import FORMAT as HF_FORMAT

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def nllb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_directory("nllb", tmp_path_factory.mktemp("nllb") / "hf", train_steps=0)


def _truncate(directory: Path) -> None:
    path = directory / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _pickled(directory: Path) -> None:
    import torch

    (directory / "model.safetensors").unlink()
    torch.save({"x": torch.zeros(1)}, directory / "pytorch_model.bin")


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "unsupported family": (edit_config(model_type="pegasus"),
                           r"config\.json: field 'model_type' is 'pegasus': not a family seqtrans imports "
                           r"\(it imports marian, bart, mbart, m2m_100"),
    "no tokenizer": (lambda d: (d / "tokenizer.json").unlink(), r"tokenizer\.json: missing"),
    "no weights": (lambda d: (d / "model.safetensors").unlink(), r"model\.safetensors: missing"),
    "wrong shape": (edit_config(encoder_ffn_dim=48, decoder_ffn_dim=48),
                    r"model\.safetensors: tensor 'model\.encoder\.layers\.0\.fc1\.weight' has shape "
                    r"\(64, 32\), but config\.json implies \(48, 32\)"),
    "truncated": (_truncate,
                  r"model\.safetensors: (truncated|not a safetensors file|tensor '[^']*': its byte range)"),
    "pickle": (_pickled, r"pytorch_model\.bin: is a pickle, and loading a pickle can run any code"),
    "vocabulary too small": (edit_config(vocab_size=10),
                             r"token id \d+ is beyond config\.json's vocab_size 10"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_directories_are_refused_naming_what_is_wrong(nllb: Path, tmp_path: Path, case: str) -> None:
    damage, message = CASES[case]
    directory = tmp_path / "hf"
    shutil.copytree(nllb, directory)
    damage(directory)
    with pytest.raises(DataError, match=message):
        HF_FORMAT.import_model(directory, out=tmp_path / "runs" / "run")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_an_unknown_language_code_is_named_with_the_models_codes(nllb: Path, tmp_path: Path) -> None:
    run = HF_FORMAT.import_model(nllb, out=tmp_path / "run")
    with pytest.raises(ConfigError, match=r"'decode\.target_lang': unknown language code 'deu_Latm'; "
                                          r"this model's codes: eng_Latn, deu_Latn, fra_Latn"):
        load(run, device="cpu", overrides=["decode.target_lang=deu_Latm"])
    loaded = load(run, device="cpu", overrides=["decode.target_lang=fra_Latn"])
    assert loaded.codec.target_tokens("x")[0] == "fra_Latn"  # type: ignore[attr-defined]


def test_sharded_weights_import_as_the_single_file_does(nllb: Path, tmp_path: Path) -> None:
    import transformers

    sharded = tmp_path / "sharded"
    transformers.AutoModelForSeq2SeqLM.from_pretrained(nllb).save_pretrained(sharded, max_shard_size="20KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (sharded / name).write_bytes((nllb / name).read_bytes())
    assert len(list(sharded.glob("model-*.safetensors"))) > 1 and not (sharded / "model.safetensors").exists()
    whole = load(HF_FORMAT.import_model(nllb, out=tmp_path / "whole"), device="cpu")
    shards = load(HF_FORMAT.import_model(sharded, out=tmp_path / "shards"), device="cpu")
    for (name, a), (_, b) in zip(whole.model.state_dict().items(), shards.model.state_dict().items()):
        assert torch.equal(a, b), name
