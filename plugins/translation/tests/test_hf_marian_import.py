"""Importing Hugging Face Marian models: after the import, seqtrans computes what
transformers computes (log-probabilities within 1e-4 in float32; greedy and beam
outputs token for token equal to ``generate``), on tiny random models built here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from marian_models import SOURCES, TARGETS, marian_directory

from seqtrans import Loaded, load
from seqtrans.data.batches import pad_batch  # internal: batches fed to both models, as the engine pads
from seqtrans.plugin import BOS, EOS, DecodeConfig
from seqtrans_translation.hf_marian import FORMAT as MARIAN_FORMAT

transformers = pytest.importorskip("transformers")

MAX_LENGTH = 40  # transformers' max_length: the start symbol, at most 38 tokens, the end symbol


@pytest.fixture(
    scope="module", params=[("swish", True), ("gelu", False)], ids=["swish-scaled", "gelu-unscaled"]
)
def imported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Loaded]:
    activation, scaled = request.param
    base = tmp_path_factory.mktemp(f"marian-{activation}")
    source = marian_directory(base / "hf", activation=activation, scale_embedding=scaled)
    run = MARIAN_FORMAT.import_model(source, out=base / "run")
    return source, load(run, device="cpu")


def _hf(source: Path) -> tuple[object, object]:
    model = transformers.MarianMTModel.from_pretrained(source).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(source)
    return model, tokenizer


def test_tokens_are_those_of_the_marian_tokenizer(imported: tuple[Path, Loaded]) -> None:
    source, loaded = imported
    _, tokenizer = _hf(source)
    vocab = loaded.codec.vocabularies.source
    for text, target in zip(SOURCES, TARGETS):
        theirs = tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"])
        ours = [vocab.symbols[i] for i in vocab.encode(loaded.codec.source_tokens(text))] + ["</s>"]
        assert ours == theirs
        theirs = tokenizer.convert_ids_to_tokens(tokenizer(text_target=target)["input_ids"])
        assert [vocab.symbols[i] for i in vocab.encode(loaded.codec.target_tokens(target))] + [
            "</s>"
        ] == theirs


def _ids(loaded: Loaded, texts: list[str], *, target: bool = False) -> list[list[int]]:
    codec, vocab = loaded.codec, loaded.codec.vocabularies.source
    return [vocab.encode(codec.target_tokens(t) if target else codec.source_tokens(t)) for t in texts]


def _marian_ids(loaded: Loaded, source: Path, ids: list[list[int]]) -> list[list[int]]:
    """seqtrans ids as the Marian model's, through the symbols."""
    import json

    marian = json.loads((source / "vocab.json").read_text(encoding="utf-8"))
    symbols = loaded.codec.vocabularies.source.symbols
    return [[marian["<pad>" if i == BOS else symbols[i]] for i in row] for row in ids]


def test_log_probabilities_equal_transformers(imported: tuple[Path, Loaded]) -> None:
    source, loaded = imported
    hf, _ = _hf(source)
    src = _ids(loaded, SOURCES)
    tgt = _ids(loaded, TARGETS, target=True)
    src_ours = pad_batch([s + [EOS] for s in src])  # [B, S]
    tgt_in = pad_batch(tgt, before=BOS)  # [B, T]
    with torch.no_grad():
        ours = torch.log_softmax(loaded.model(src_ours, tgt_in), dim=-1)  # [B, T, V+1]
        pad = hf.config.pad_token_id
        src_hf = pad_batch(_marian_ids(loaded, source, [s + [EOS] for s in src]), pad=pad)
        tgt_hf = pad_batch(_marian_ids(loaded, source, [[BOS, *t] for t in tgt]), pad=pad)
        theirs = torch.log_softmax(
            hf(input_ids=src_hf, attention_mask=src_hf.ne(pad), decoder_input_ids=tgt_hf).logits, dim=-1
        )  # [B, T, V]
    # column j of ours is Marian's column of the same symbol; seqtrans's <pad> (column 0) has none
    symbols = loaded.codec.vocabularies.source.symbols
    columns = _marian_ids(loaded, source, [list(range(1, len(symbols)))])[0]
    for b, t in enumerate(tgt):
        n = len(t) + 1  # BOS y -> y EOS
        diff = (ours[b, :n, 1:] - theirs[b, :n, columns]).abs().max().item()
        assert diff <= 1e-4, f"sentence {b}: log-probabilities differ by {diff}"
        assert ours[b, :n, 0].exp().max().item() == 0.0  # <pad> takes no probability
        # the sum over the symbols Marian has is the whole distribution
        torch.testing.assert_close(theirs[b, :n].logsumexp(-1), torch.zeros(n), atol=1e-5, rtol=0)


def _generate(hf: object, loaded: Loaded, source: Path, *, beam: int, lp: float) -> list[list[int]]:
    pad = hf.config.pad_token_id  # type: ignore[attr-defined]
    src = pad_batch(_marian_ids(loaded, source, [s + [EOS] for s in _ids(loaded, SOURCES)]), pad=pad)
    out = hf.generate(
        input_ids=src,
        attention_mask=src.ne(pad),
        num_beams=beam,  # type: ignore[attr-defined]
        do_sample=False,
        max_length=MAX_LENGTH,
        length_penalty=lp,
        early_stopping="never",
        bad_words_ids=[[pad]],
        forced_eos_token_id=hf.config.eos_token_id,
    )  # type: ignore[attr-defined]
    rows = []
    for row in out.tolist():
        row = row[1:]  # the start symbol
        rows.append(row[: row.index(0)] if 0 in row else row)  # up to Marian's </s> (id 0)
    return rows


@pytest.mark.parametrize("beam, lp", [(1, 0.0), (4, 0.0), (4, 1.0), (5, 0.6)])
def test_greedy_and_beam_outputs_equal_generate(imported: tuple[Path, Loaded], beam: int, lp: float) -> None:
    """transformers' length_penalty divides by |Y|^lp: decode.length_penalty=power; it ends
    a hypothesis only where the end symbol ranks within the beam: decode.end_in_beam (seqtrans's
    default keeps the other endings too, and may find better outputs). early_stopping='never'
    is transformers' exact stopping rule, seqtrans's only one. At the length limit
    transformers forces the end symbol at no cost where seqtrans counts its log-probability,
    so the limit is one that no output reaches."""
    source, loaded = imported
    hf, _ = _hf(source)
    expected = _generate(hf, loaded, source, beam=beam, lp=lp)
    settings = DecodeConfig(
        beam=beam, alpha=lp, length_penalty="power", end_in_beam=True, max_len_a=0.0, max_len_b=MAX_LENGTH - 2
    )
    _, hypotheses = loaded.decode(SOURCES, decode=settings)
    got = _marian_ids(loaded, source, [h[0].tokens for h in hypotheses])
    assert got == expected
    assert len({tuple(r) for r in expected}) > 1  # the outputs depend on the input
    assert all(len(r) < MAX_LENGTH - 2 for r in expected)  # each ended by itself
