"""``seqtrans export --to hf`` of the T5 family (T5 v1.0 and v1.1, mT5, ByT5, and a T5
model whose tokenizer is its sentencepiece model alone): the directory loads in
transformers and computes what seqtrans computes (teacher-forced logits within 1e-4,
greedy outputs token for token and as text), it imports again to the same weights, a
run fine-tuned with ``--init`` exports too, and what the format cannot hold is refused
before anything is written."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_models import model_ids, our_ids
from marian_models import SOURCES, TARGETS
from t5_models import MAX_LENGTH, t5_directory, training_pairs

import seqtrans
from seqtrans import Loaded, export, initial, load, with_initial_model
from seqtrans.data.batches import pad_batch  # internal: batches fed to both models, as the engine pads
from seqtrans.plugin import BOS, EOS, PAD, DecodeConfig, UsageError
from seqtrans_translation.hf import FORMAT as HF_FORMAT

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

VARIANTS = ["t5", "t5v11", "mt5", "byt5", "t5-spiece"]
Made = Callable[[str], tuple[Path, Path]]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Made:
    """A variant's model directory and its imported run, made once for the module."""
    cache: dict[str, tuple[Path, Path]] = {}

    def make(variant: str) -> tuple[Path, Path]:
        if variant not in cache:
            base = tmp_path_factory.mktemp(variant)
            source = t5_directory(variant.removesuffix("-spiece"), base / "hf",
                                  spiece_only=variant.endswith("-spiece"))
            cache[variant] = source, HF_FORMAT.import_model(source, out=base / "run")
        return cache[variant]

    return make


def _hf(directory: Path) -> tuple[Any, Any]:
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(directory).eval()
    return model, transformers.AutoTokenizer.from_pretrained(directory)


def assert_logits_match(loaded: Loaded, hf: Any, *, skip_padding: bool = False) -> None:
    """Teacher-forced logits of the seqtrans run within 1e-4 of the exported model's, at
    every position of every target and every id but seqtrans's ``<s>`` (and with
    ``skip_padding`` the padding's, a tied head's row that fine-tuning moved)."""
    src = [[*s, EOS] for s in our_ids(loaded, SOURCES)]
    tgt = our_ids(loaded, TARGETS, target=True)
    pad = hf.config.pad_token_id
    with torch.no_grad():
        ours = loaded.model(pad_batch(src), pad_batch(tgt, before=BOS))  # [B, T, V+1]
        src_hf = pad_batch(model_ids(loaded, src), pad=pad)
        tgt_hf = pad_batch(model_ids(loaded, [[BOS, *t] for t in tgt]), pad=pad)
        theirs = hf(input_ids=src_hf, attention_mask=src_hf.ne(pad), decoder_input_ids=tgt_hf).logits
    order = torch.tensor(loaded.codec.ids.hf_ids)  # type: ignore[attr-defined]
    keep = torch.ones(order.numel(), dtype=torch.bool)
    keep[BOS] = False
    keep[PAD] = not skip_padding
    for b, t in enumerate(tgt):
        n = len(t) + 1  # <s> y -> y </s>
        diff = (ours[b, :n, keep] - theirs[b, :n, order[keep]]).abs().max().item()
        assert diff <= 1e-4, f"sentence {b}: logits differ by {diff}"


def _cut(row: list[int], eos: int) -> list[int]:
    """An output after the decoder start, up to its end (all of it where it has none)."""
    row = row[1:]
    return row[: row.index(eos)] if eos in row else row


def assert_greedy_outputs_match(loaded: Loaded, hf: Any, tokenizer: Any, max_length: int) -> None:
    """``generate``'s greedy outputs are seqtrans's, token for token and as text."""
    batch = tokenizer(SOURCES, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = hf.generate(**batch, num_beams=1, do_sample=False, max_length=max_length,
                          bad_words_ids=[[hf.config.pad_token_id]])
    expected = [_cut(row, hf.config.eos_token_id) for row in out.tolist()]
    settings = DecodeConfig(beam=1, max_len_a=0.0, max_len_b=max_length - 2)
    predictions, hypotheses = loaded.decode(SOURCES, decode=settings)
    assert model_ids(loaded, [h[0].tokens for h in hypotheses]) == expected
    assert len({tuple(r) for r in expected}) > 1  # the outputs depend on the input
    assert predictions == tokenizer.batch_decode(expected, skip_special_tokens=True)


@pytest.mark.parametrize("variant", VARIANTS)
def test_an_exported_model_computes_what_seqtrans_computes(variant: str, made: Made, tmp_path: Path) -> None:
    source, imported = made(variant)
    exported = export(imported, to="hf", out=tmp_path / "exported")
    config = json.loads((exported / "config.json").read_text(encoding="utf-8"))
    assert config["model_type"] == ("mt5" if variant == "mt5" else "t5")
    tokenizer_file = {"byt5": None, "t5-spiece": "spiece.model"}.get(variant, "tokenizer.json")
    if tokenizer_file is not None:
        assert (exported / tokenizer_file).read_bytes() == (source / tokenizer_file).read_bytes()
    loaded = load(imported, device="cpu")
    hf, tokenizer = _hf(exported)
    assert type(tokenizer).__name__ == type(transformers.AutoTokenizer.from_pretrained(source)).__name__
    for text in SOURCES:  # the exported tokenizer cuts text as the run does
        assert tokenizer(text)["input_ids"] == model_ids(loaded, [[*our_ids(loaded, [text])[0], EOS]])[0]
    assert_logits_match(loaded, hf)
    assert_greedy_outputs_match(loaded, hf, tokenizer, MAX_LENGTH[variant.removesuffix("-spiece")])


@pytest.mark.parametrize("variant", ["t5", "byt5"])
def test_import_export_import_keeps_every_weight(variant: str, made: Made, tmp_path: Path) -> None:
    _, imported = made(variant)
    exported = export(imported, to="hf", out=tmp_path / "exported")
    again = load(HF_FORMAT.import_model(exported, out=tmp_path / "again"), device="cpu")
    first = load(imported, device="cpu")
    assert again.config.model == first.config.model
    assert again.codec.ids == first.codec.ids  # type: ignore[attr-defined]
    ours, theirs = first.model.state_dict(), again.model.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


def _tsv(path: Path, sources: list[str], targets: list[str]) -> str:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in zip(sources, targets)), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("variant", ["t5", "t5v11"])
def test_a_fine_tuned_run_exports(variant: str, made: Made, tmp_path: Path) -> None:
    _, imported = made(variant)
    sources, targets = training_pairs(7)
    data = _tsv(tmp_path / "train.tsv", sources, targets)
    overrides = [
        "data.dataset=none", f"data.train_tsv={data}", f"data.dev_tsv={data}", f"data.test_tsv={data}",
        f"train.data_cache={tmp_path / 'cache'}", "train.max_steps=4", "train.max_tokens=100000",
        "train.warmup=1", "train.lr_scale=0.02", "train.log_every=1", "train.eval_every=4",
        "train.checkpoint_every=4", "train.average_last=1", "train.keep_checkpoints=1",
        "train.precision=fp32", "decode.beam=1",
    ]
    init = initial(imported)
    config = with_initial_model(seqtrans.resolve_config("translation", overrides=overrides), init, overrides)
    seqtrans.run(config, tmp_path / "tuned", device="cpu", init=init)
    tuned, start = load(tmp_path / "tuned", device="cpu"), load(imported, device="cpu")
    assert torch.equal(tuned.model.output_bias, start.model.output_bias)  # type: ignore[arg-type]
    rows = tuned.model.target_embed.weight
    assert not torch.equal(rows[BOS], rows[PAD])  # the decoder start's row moved: <s>'s is exported
    exported = export(tmp_path / "tuned", to="hf", out=tmp_path / "exported")
    hf, tokenizer = _hf(exported)
    assert_logits_match(tuned, hf, skip_padding=variant == "t5")
    assert_greedy_outputs_match(tuned, hf, tokenizer, MAX_LENGTH[variant])


def _refused(loaded: Loaded, out: Path, match: str) -> None:
    before = set(out.parent.iterdir())
    with pytest.raises(UsageError, match=match):
        HF_FORMAT.export_model(loaded, out=out)
    assert set(out.parent.iterdir()) == before  # nothing written, not even a scratch directory


@pytest.mark.parametrize(("option", "value"), [("attention_scale", True), ("norm_kind", "layer"),
                                               ("activation", "gelu"), ("scale_output", True)])
def test_an_option_t5_lacks_is_refused_by_name(option: str, value: object, made: Made,
                                                tmp_path: Path) -> None:
    _, imported = made("mt5")  # mT5 never scales its decoder's output
    loaded = load(imported, device="cpu")
    changed = replace(loaded, config=replace(loaded.config, model=replace(loaded.config.model,
                                                                          **{option: value})))
    _refused(changed, tmp_path / "out", f"model.{option}=")


def test_a_trained_output_bias_is_refused(made: Made, tmp_path: Path) -> None:
    _, imported = made("t5")
    loaded = load(imported, device="cpu")
    with torch.no_grad():
        loaded.model.output_bias[5] += 0.5  # type: ignore[index]
    _refused(loaded, tmp_path / "out", "model.fixed_output_bias=false")
