"""``seqtrans run translation --init RUN_DIR`` from an imported NLLB model, its target
language set: the training pairs are encoded with that language's code, and the first
update's loss is the loaded model's loss on the same pairs in that language."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_models import hf_directory
from marian_models import _pairs

import seqtrans
from seqtrans import export, initial, load, with_initial_model
from seqtrans.data.batches import pad_batch  # internal: batches fed to both models, as the engine pads
from seqtrans.plugin import BOS, EOS
from seqtrans.training.loss import label_smoothed_loss  # internal: the loss compared with transformers'
from seqtrans_translation.hf import FORMAT as HF_FORMAT

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


def _tsv(path: Path, sources: list[str], targets: list[str]) -> str:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in zip(sources, targets)), encoding="utf-8")
    return str(path)


def test_a_run_starts_from_an_imported_model_in_the_languages_it_is_given(tmp_path: Path) -> None:
    source = hf_directory("nllb", tmp_path / "hf", d_model=16, layers=1, train_steps=0)
    imported = HF_FORMAT.import_model(source, out=tmp_path / "imported")
    sources, targets = _pairs(12, 5)
    data = _tsv(tmp_path / "train.tsv", sources, targets)
    languages = ["decode.source_lang=eng_Latn", "decode.target_lang=fra_Latn"]
    overrides = [
        "data.dataset=none", f"data.train_tsv={data}", f"data.dev_tsv={data}", f"data.test_tsv={data}",
        f"train.data_cache={tmp_path / 'cache'}", "train.max_steps=1", "train.max_tokens=100000",
        "train.log_every=1", "train.eval_every=1", "train.checkpoint_every=1", "train.average_last=1",
        "train.keep_checkpoints=1", "train.precision=fp32", "train.label_smoothing=0.1", "model.dropout=0.0",
        "decode.beam=1", *languages,
    ]
    init = initial(imported)
    config = with_initial_model(seqtrans.resolve_config("translation", overrides=overrides), init, overrides)
    seqtrans.run(config, tmp_path / "run", device="cpu", init=init)

    first = json.loads((tmp_path / "run" / "train.jsonl").read_text(encoding="utf-8").splitlines()[0])
    loaded = load(imported, device="cpu", overrides=languages)
    codec, vocab = loaded.codec, loaded.codec.vocabularies.source
    assert codec.target_tokens("x")[0] == "fra_Latn"
    src = pad_batch([vocab.encode(codec.source_tokens(s)) + [EOS] for s in sources])
    tgt = [vocab.encode(codec.target_tokens(t)) for t in targets]
    with torch.no_grad():
        logits = loaded.model(src, pad_batch(tgt, before=BOS))
        loss, _ = label_smoothed_loss(logits, pad_batch(tgt, after=EOS), smoothing=0.1)
    expected = float(loss) / sum(len(t) + 1 for t in tgt)
    assert first["step"] == 1 and first["loss"] == pytest.approx(expected, rel=1e-5)
    # the fine-tuned run decodes into the language it was trained in, its code left out of the text
    tuned = load(tmp_path / "run", device="cpu")
    assert tuned.codec.target_prefix() == ["fra_Latn"]  # type: ignore[attr-defined]
    predictions, hypotheses = tuned.decode(sources[:2])
    assert all(h[0].tokens[0] == vocab.index("fra_Latn") for h in hypotheses)
    assert not any("fra_Latn" in p for p in predictions)
    # the bias only shuts out seqtrans's <s>: not trained, so that the tuned model exports
    assert torch.equal(tuned.model.output_bias, loaded.model.output_bias)  # type: ignore[arg-type]
    exported = export(tmp_path / "run", to="hf", out=tmp_path / "exported")
    assert (exported / "model.safetensors").exists()
