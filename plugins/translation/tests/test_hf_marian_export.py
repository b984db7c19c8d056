"""Exporting translation models to the Hugging Face Marian format: transformers loads
the directory, computes seqtrans's logits, and its greedy outputs are seqtrans's; what
the format cannot hold is refused by name, before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from marian_models import SOURCE_WORDS, SOURCES, TARGET_WORDS, TARGETS, marian_directory, sentences

from seqtrans import Loaded, build_model, load
from seqtrans.data.batches import pad_batch  # internal: batches fed to both models, as the engine pads
from seqtrans.plugin import BOS, EOS, PAD, ConfigError, DecodeConfig, ModelConfig, RunConfig
from seqtrans_translation import TranslationConfig, TranslationTask
from seqtrans_translation.hf_marian import FORMAT as MARIAN_FORMAT
from seqtrans_translation.subwords import Subwords, SubwordSettings, train
from seqtrans_translation.task import TranslationCodec

transformers = pytest.importorskip("transformers")

MAX_LENGTH = 24


def _scratch_model(**model: object) -> Loaded:
    """A random seqtrans translation model with a shared sentencepiece vocabulary."""
    texts = sentences(SOURCE_WORDS, 100, 1) + sentences(TARGET_WORDS, 100, 2)
    codec = TranslationCodec(Subwords(train(texts, SubwordSettings(vocab_size=300))))
    options = {
        "encoder_layers": 2,
        "decoder_layers": 2,
        "d_model": 32,
        "d_ff": 64,
        "heads": 4,
        "dropout": 0.0,
        **model,
    }
    config = RunConfig(
        task="translation", model=ModelConfig(**options), data=TranslationConfig(dataset="none")
    )
    torch.manual_seed(0)
    built = build_model(config.model, codec).eval()
    with torch.no_grad():  # weights of some size, so that outputs depend on the input
        for name, p in built.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.25)
    return Loaded(config, TranslationTask(config.data), codec, built, torch.device("cpu"))


def _compare(loaded: Loaded, out: Path) -> None:
    hf = transformers.MarianMTModel.from_pretrained(out).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(out)
    vocab = loaded.codec.vocabularies.source
    src = [vocab.encode(loaded.codec.source_tokens(s)) + [EOS] for s in SOURCES]
    assert [tokenizer(s)["input_ids"] for s in SOURCES] == src  # the same ids
    tgt = [vocab.encode(loaded.codec.target_tokens(t)) for t in TARGETS]
    src_b, tgt_in = pad_batch(src), pad_batch(tgt, before=BOS)
    with torch.no_grad():
        ours = torch.log_softmax(loaded.model(src_b, tgt_in), -1)
        theirs = torch.log_softmax(
            hf(input_ids=src_b, attention_mask=src_b.ne(PAD), decoder_input_ids=tgt_in).logits, -1
        )
    for b, t in enumerate(tgt):
        assert (ours[b, : len(t) + 1] - theirs[b, : len(t) + 1]).abs().max().item() <= 1e-4
    generated = hf.generate(
        input_ids=src_b, attention_mask=src_b.ne(PAD), num_beams=1, do_sample=False, max_length=MAX_LENGTH
    )  # the exported generation config: start <s>, no <pad> or <s>
    expected = []
    for row in generated.tolist():
        row = row[1:]
        expected.append(row[: row.index(EOS)] if EOS in row else row)
    _, hypotheses = loaded.decode(
        SOURCES, decode=DecodeConfig(beam=1, max_len_a=0.0, max_len_b=MAX_LENGTH - 2)
    )
    assert [h[0].tokens for h in hypotheses] == expected
    assert len({tuple(r) for r in expected}) > 1


@pytest.mark.parametrize(
    "model",
    [
        {},
        {
            "activation": "gelu",
            "sinusoid_layout": "split",
            "output_bias": True,
            "scale_embeddings": False,
            "tie_output": False,
        },
    ],
    ids=["paper", "options"],
)
def test_a_seqtrans_model_exports_and_transformers_computes_the_same(tmp_path: Path, model: dict) -> None:
    loaded = _scratch_model(**model)
    if loaded.model.output_bias is not None:
        with torch.no_grad():
            loaded.model.output_bias.normal_()
    out = MARIAN_FORMAT.export_model(loaded, out=tmp_path / "hf")
    _compare(loaded, out)
    _reimport_computes_the_same(loaded, out, tmp_path / "again")


def _reimport_computes_the_same(loaded: Loaded, exported: Path, run: Path) -> None:
    """The exported directory imported back: the original's log-probabilities (every
    symbol, <pad> and <s> included) and its beam outputs."""
    again = load(MARIAN_FORMAT.import_model(exported, out=run), device="cpu")
    vocab = loaded.codec.vocabularies.source
    assert again.codec.vocabularies.source.symbols == vocab.symbols
    src = pad_batch([vocab.encode(loaded.codec.source_tokens(s)) + [EOS] for s in SOURCES])
    tgt_in = pad_batch([vocab.encode(loaded.codec.target_tokens(t)) for t in TARGETS], before=BOS)
    with torch.no_grad():
        ours, theirs = (torch.log_softmax(m.model(src, tgt_in), -1) for m in (loaded, again))
    assert (ours - theirs).abs().max().item() <= 1e-4
    settings = DecodeConfig(beam=3, max_len_a=0.0, max_len_b=MAX_LENGTH)
    assert again.decode(SOURCES, decode=settings)[0] == loaded.decode(SOURCES, decode=settings)[0]


def test_an_imported_model_exports_back(tmp_path: Path) -> None:
    source = marian_directory(tmp_path / "hf")
    run = MARIAN_FORMAT.import_model(source, out=tmp_path / "run")
    loaded = load(run, device="cpu")
    out = MARIAN_FORMAT.export_model(loaded, out=tmp_path / "again")
    _compare(loaded, out)
    assert json.loads((out / "vocab.json").read_text(encoding="utf-8"))["<s>"] == BOS


@pytest.mark.parametrize(
    "setting, key",
    [
        ({"cross_attention": "monotonic"}, "model.cross_attention"),
        ({"norm": "pre"}, "model.norm"),
        ({"positions": "learned"}, "model.positions"),
        ({"embedding_norm": True}, "model.embedding_norm"),
        ({"norm_kind": "rms"}, "model.norm_kind"),
        ({"gated_ffn": True}, "model.gated_ffn"),
        ({"bias": False}, "model.bias"),
        ({"head_dim": 8}, "model.head_dim"),
    ],
)
def test_what_the_format_cannot_hold_is_refused_by_name(tmp_path: Path, setting: dict, key: str) -> None:
    loaded = _scratch_model(**setting)
    with pytest.raises(ConfigError, match=f"'{key}': cannot export to hf-marian"):
        MARIAN_FORMAT.export_model(loaded, out=tmp_path / "hf")
    assert list(tmp_path.iterdir()) == []
