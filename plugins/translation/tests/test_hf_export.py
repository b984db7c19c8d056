"""``seqtrans export --to hf``: an imported BART-family model written back is one that
transformers loads and decodes as the original (the same logits, the same outputs),
and that imports again to the same run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hf_models import LANGUAGES, hf_directory
from marian_models import SOURCES, marian_directory

from seqtrans import export, load
from seqtrans.plugin import UsageError
from seqtrans_translation.hf import FORMAT as HF_FORMAT
from seqtrans_translation.hf_marian import FORMAT as MARIAN_FORMAT

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


@pytest.mark.parametrize("family", ["nllb", "bart"])
def test_an_exported_model_decodes_as_the_original(family: str, tmp_path: Path) -> None:
    source = hf_directory(family, tmp_path / "hf", train_steps=60)
    run = HF_FORMAT.import_model(source, out=tmp_path / "run")
    exported = export(run, to="hf", out=tmp_path / "exported")
    _, src_lang, tgt_lang = LANGUAGES[family]
    options = {"src_lang": src_lang, "tgt_lang": tgt_lang} if src_lang else {}
    outputs = []
    for directory in (source, exported):
        model = transformers.AutoModelForSeq2SeqLM.from_pretrained(directory).eval()
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory, **options)
        batch = tokenizer(SOURCES, return_tensors="pt", padding=True)
        forced = tokenizer.convert_tokens_to_ids(tgt_lang) if tgt_lang else tokenizer.bos_token_id
        with torch.no_grad():
            generated = model.generate(**batch, num_beams=1, max_length=40, forced_bos_token_id=forced)
            logits = model(**batch, decoder_input_ids=generated).logits
        outputs.append((generated, logits, tokenizer.batch_decode(generated, skip_special_tokens=True)))
    (before, logits_before, text_before), (after, logits_after, text_after) = outputs
    assert torch.equal(before, after) and text_before == text_after
    torch.testing.assert_close(logits_after, logits_before, atol=1e-5, rtol=0)
    again = load(HF_FORMAT.import_model(exported, out=tmp_path / "again"), device="cpu")
    first = load(run, device="cpu")
    assert again.decode(SOURCES)[0] == first.decode(SOURCES)[0]


def test_a_model_of_another_vocabulary_is_refused(tmp_path: Path) -> None:
    source = marian_directory(tmp_path / "marian", train_steps=0)
    run = MARIAN_FORMAT.import_model(source, out=tmp_path / "run")
    with pytest.raises(UsageError, match="--to hf writes models imported with 'seqtrans import hf'"):
        export(run, to="hf", out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
