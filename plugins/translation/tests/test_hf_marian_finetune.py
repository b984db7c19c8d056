"""``seqtrans run translation --init RUN_DIR``: training starts from the given model's
weights and vocabulary (an imported Marian model here): the first update's loss is the
loaded model's loss on the same pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from marian_models import _pairs, marian_directory

import seqtrans
from seqtrans import initial, load, with_initial_model
from seqtrans.data.batches import pad_batch  # internal: batches fed to both models, as the engine pads
from seqtrans.plugin import BOS, EOS, UsageError
from seqtrans.training.loss import label_smoothed_loss  # internal: the loss compared with transformers'
from seqtrans_translation.hf_marian import FORMAT as MARIAN_FORMAT

pytest.importorskip("transformers")


def _tsv(path: Path, sources: list[str], targets: list[str]) -> str:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in zip(sources, targets)), encoding="utf-8")
    return str(path)


def test_a_run_starts_from_the_weights_of_an_imported_model(tmp_path: Path) -> None:
    source = marian_directory(tmp_path / "hf", d_model=16, layers=1, train_steps=0)
    imported = MARIAN_FORMAT.import_model(source, out=tmp_path / "imported")
    sources, targets = _pairs(12, 5)
    data = _tsv(tmp_path / "train.tsv", sources, targets)
    overrides = [
        "data.dataset=none",
        f"data.train_tsv={data}",
        f"data.dev_tsv={data}",
        f"data.test_tsv={data}",
        f"train.data_cache={tmp_path / 'cache'}",
        "train.max_steps=1",
        "train.max_tokens=100000",
        "train.log_every=1",
        "train.eval_every=1",
        "train.checkpoint_every=1",
        "train.average_last=1",
        "train.keep_checkpoints=1",
        "train.precision=fp32",
        "train.label_smoothing=0.1",
        "model.dropout=0.0",
        "decode.beam=1",
    ]
    init = initial(imported)
    config = with_initial_model(seqtrans.resolve_config("translation", overrides=overrides), init, overrides)
    assert config.model.d_model == 16 and config.model.activation == "silu" and config.model.output_bias
    seqtrans.run(config, tmp_path / "run", device="cpu", init=init)

    first = json.loads((tmp_path / "run" / "train.jsonl").read_text(encoding="utf-8").splitlines()[0])
    loaded = load(imported, device="cpu")
    codec, vocab = loaded.codec, loaded.codec.vocabularies.source
    src = pad_batch([vocab.encode(codec.source_tokens(s)) + [EOS] for s in sources])
    tgt = [vocab.encode(codec.target_tokens(t)) for t in targets]
    with torch.no_grad():
        logits = loaded.model(src, pad_batch(tgt, before=BOS))
        loss, _ = label_smoothed_loss(logits, pad_batch(tgt, after=EOS), smoothing=0.1)
    expected = float(loss) / sum(len(t) + 1 for t in tgt)
    assert first["step"] == 1 and first["loss"] == pytest.approx(expected, rel=1e-5)
    assert (tmp_path / "run" / "vocab" / "vocab.txt").read_bytes() == (
        imported / "vocab" / "vocab.txt"
    ).read_bytes()


def test_init_refuses_a_model_of_a_task_without_a_text_form(tmp_path: Path) -> None:
    # a run of another task keeps the model only where both tasks read and write text
    # (seqtrans.tasks.handover); parsing's sources and predictions have no text form
    source = marian_directory(tmp_path / "hf", d_model=16, layers=1, train_steps=0)
    init = initial(MARIAN_FORMAT.import_model(source, out=tmp_path / "imported"))
    with pytest.raises(UsageError, match="a model of task 'translation', not 'parsing'"):
        with_initial_model(seqtrans.resolve_config("parsing"), init)
