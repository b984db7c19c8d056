"""A T5 model imported with ``seqtrans import hf`` (a translation run) fine-tuned on
another task, the copy task: the run keeps the model's codec (ByT5's bytes cut the copy
task's text form), trains, writes checkpoints, continues from them, and decodes into the
copy task's own predictions, through the engine's public seams alone; and it exports as
a T5 model that transformers decodes to the same sequences."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from t5_models import t5_directory

import seqtrans
from seqtrans import export, initial, load, with_initial_model
from seqtrans.plugin import DecodeConfig, TextCodec, UsageError
from seqtrans.tasks.handover import FILE  # internal: the file that names the model's task
from seqtrans_translation.hf import FORMAT as HF_FORMAT

transformers = pytest.importorskip("transformers")
pytest.importorskip("seqtrans_copy")


def _steps(directory: Path) -> list[dict]:
    lines = (directory / "train.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if "loss" in r]


def test_an_imported_t5_model_fine_tunes_on_the_copy_task(tmp_path: Path) -> None:
    source = t5_directory("byt5", tmp_path / "hf", train_steps=0)
    imported = HF_FORMAT.import_model(source, out=tmp_path / "imported")
    settings = [
        "data.vocab_size=5", "data.max_length=4", "data.train_size=300", "data.dev_size=4",
        "data.test_size=6",
        f"train.data_cache={tmp_path / 'cache'}", "train.max_tokens=1500", "train.warmup=10",
        "train.lr_scale=0.5", "train.log_every=1", "train.eval_every=1000", "train.checkpoint_every=15",
        "train.average_last=1", "train.keep_checkpoints=2", "train.max_minutes=0", "train.precision=fp32",
        "decode.max_len_a=1.0", "decode.max_len_b=4",
    ]
    init = initial(imported)
    out = tmp_path / "copy"
    for steps in (15, 30):  # the second run continues the first from its checkpoint
        overrides = [*settings, f"train.max_steps={steps}"]
        config = with_initial_model(seqtrans.resolve_config("copy", overrides=overrides), init, overrides)
        metrics = seqtrans.run(config, out, device="cpu", init=init)
    assert (out / "vocab" / FILE).is_file() and (out / "vocab" / "hf.json").is_file()
    logged = _steps(out)
    assert [r["step"] for r in logged] == list(range(1, 31))  # continued, not started again
    first, last = logged[0]["loss"], sum(r["loss"] for r in logged[-5:]) / 5
    assert last < 0.7 * first, (first, last)
    assert 0.0 <= metrics["exact_match"] <= 1.0

    tuned = load(out, device="cpu")
    assert isinstance(tuned.codec, TextCodec)
    imported_codec = load(imported, device="cpu").codec
    assert tuned.codec.source_tokens([1, 0, 4]) == imported_codec.source_tokens("1 0 4")  # ByT5's bytes
    sources = [[1, 0, 4], [3, 3], [2]]
    predictions, _ = tuned.decode(sources, decode=DecodeConfig(beam=1, max_len_a=0.0, max_len_b=10))
    assert all(isinstance(p, list) and all(isinstance(s, int) for s in p) for p in predictions)

    # the fine-tuned model exports as a T5 model that transformers decodes to the same sequences
    exported = export(out, to="hf", out=tmp_path / "exported")
    hf = transformers.AutoModelForSeq2SeqLM.from_pretrained(exported).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    batch = tokenizer([tuned.task.format_source(s) for s in sources], return_tensors="pt", padding=True)
    generated = hf.generate(**batch, num_beams=1, do_sample=False, max_length=12, bad_words_ids=[[0]])
    texts = tokenizer.batch_decode(generated, skip_special_tokens=True)
    assert [tuned.task.parse_source(t) for t in texts] == predictions


def test_a_task_without_a_text_form_is_refused_by_what_it_lacks(tmp_path: Path) -> None:
    source = t5_directory("byt5", tmp_path / "hf", d_model=16, train_steps=0)
    init = initial(HF_FORMAT.import_model(source, out=tmp_path / "imported"))
    config = seqtrans.resolve_config("parsing", overrides=[])
    with pytest.raises(UsageError, match="task 'parsing' has no text form"):
        with_initial_model(config, init)
