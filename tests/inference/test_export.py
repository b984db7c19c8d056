"""Export to CTranslate2: its greedy outputs of the exported model are seqtrans's, token
for token, and its scores are the log-probabilities the seqtrans model gives them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ctranslate2
import pytest
import torch
from counting_extension import CountingExtension

from seqtrans.cli import main
from seqtrans.config import ModelConfig
from seqtrans.data.vocab import BOS, EOS, PAD, Vocab, Vocabularies
from seqtrans.decoding import greedy_search
from seqtrans.errors import ConfigError, UsageError
from seqtrans.inference.export import export_ctranslate2, unsupported
from seqtrans.inference.loading import load
from seqtrans.model.extension import ExtensionError, ModelExtension
from seqtrans.model.transformer import Transformer

MAX_LEN = 10


def tiny(*, seed: int, shared: bool, **overrides: object) -> tuple[Transformer, Vocabularies]:
    """A 2-layer, width-16 model with random weights and vocabularies of made-up words."""
    torch.manual_seed(seed)
    source = Vocab(f"s{i}" for i in range(36))
    target = source if shared else Vocab(f"t{i}" for i in range(39))
    config = ModelConfig(encoder_layers=2, decoder_layers=2, d_model=16, d_ff=32, heads=4, dropout=0.0,
                         max_positions=64, **overrides)  # type: ignore[arg-type]
    model = Transformer(config, source_vocab_size=len(source), target_vocab_size=len(target),
                        shared_vocab=shared).eval()
    return model, Vocabularies(source, target)


def sources(vocab: Vocab, *, seed: int, count: int = 8) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 9, (count,), generator=g).tolist()
    return [torch.randint(4, len(vocab), (n,), generator=g).tolist() for n in lengths]


def padded(ids: list[list[int]]) -> torch.Tensor:
    """Sources with their end symbol, padded.  -> [B, S]"""
    src = torch.full((len(ids), max(map(len, ids)) + 1), PAD)
    for i, s in enumerate(ids):
        src[i, : len(s) + 1] = torch.tensor(s + [EOS])
    return src


def ct2_decode(path: Path, vocab: Vocab, ids: list[list[int]], *,
               beam: int = 1) -> list[ctranslate2.TranslationResult]:
    translator = ctranslate2.Translator(str(path), device="cpu", intra_threads=1)
    # seqtrans never emits padding or the start symbol; CTranslate2 must be told
    return translator.translate_batch([[vocab.symbols[i] for i in s] for s in ids], beam_size=beam,
                                      max_decoding_length=MAX_LEN, min_decoding_length=0,
                                      length_penalty=0.0, return_scores=True,
                                      suppress_sequences=[["<pad>"], ["<s>"]])


def log_prob(model: Transformer, src: torch.Tensor, tokens: list[int]) -> float:
    """log P(tokens [+ EOS] | src) with padding and the start symbol excluded from the
    softmax, as CTranslate2's suppression does; EOS counts when the output ended early."""
    with torch.no_grad():
        logits = model(src[None], torch.tensor([[BOS] + tokens]))[0]  # [T+1, V]
    logits[:, [PAD, BOS]] = float("-inf")
    lp = logits.log_softmax(-1)
    targets = tokens + ([EOS] if len(tokens) < MAX_LEN else [])
    return sum(float(lp[j, t]) for j, t in enumerate(targets))


CASES = {
    "post-norm, shared vocabulary, tied": dict(shared=True),
    "pre-norm, shared vocabulary, tied": dict(shared=True, norm="pre"),
    "post-norm, separate vocabularies, untied": dict(shared=False, tie_output=False),
    "pre-norm, separate vocabularies, learned positions": dict(shared=False, norm="pre",
                                                               positions="learned"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_ctranslate2_greedy_outputs_are_seqtrans_token_for_token(case: str, tmp_path: Path) -> None:
    model, vocabs = tiny(seed=len(case), **CASES[case])  # type: ignore[arg-type]
    out = export_ctranslate2(model, vocabs, tmp_path / "ct2")
    ids = sources(vocabs.source, seed=1)
    src = padded(ids)
    ours = greedy_search(model, src, max_len=torch.full((len(ids),), MAX_LEN))
    theirs = ct2_decode(out, vocabs.source, ids)
    for i, (mine, result) in enumerate(zip(ours, theirs)):
        tokens = [vocabs.target.index(t) for t in result.hypotheses[0]]
        assert tokens == mine[0].tokens, f"source {i}"
        assert result.scores[0] == pytest.approx(log_prob(model, src[i], tokens), abs=1e-4)
    # beam search follows other conventions (docs/export.md), but scores with the same model
    for i, result in enumerate(ct2_decode(out, vocabs.source, ids, beam=4)):
        tokens = [vocabs.target.index(t) for t in result.hypotheses[0]]
        assert result.scores[0] == pytest.approx(log_prob(model, src[i], tokens), abs=1e-4)


def test_int8_stores_quantized_weights_that_decode(tmp_path: Path) -> None:
    model, vocabs = tiny(seed=3, shared=False, tie_output=False)
    fp32 = export_ctranslate2(model, vocabs, tmp_path / "fp32")
    int8 = export_ctranslate2(model, vocabs, tmp_path / "int8", quantization="int8")
    # matrices and embeddings one byte a weight instead of four; norms and biases stay float
    assert (int8 / "model.bin").stat().st_size < 0.5 * (fp32 / "model.bin").stat().st_size
    ids = sources(vocabs.source, seed=2)
    results = ct2_decode(int8, vocabs.source, ids)
    assert all(len(r.hypotheses[0]) <= MAX_LEN for r in results)


@pytest.mark.parametrize(("overrides", "key"), [
    ({"cross_attention": "monotonic"}, "model.cross_attention"),
    ({"encoder_attention": "restricted"}, "model.encoder_attention"),
    ({"causal_encoder": True}, "model.causal_encoder"),
    ({"wait_k": 3}, "model.wait_k"),
    ({"positions": "relative"}, "model.positions"),
    ({"norm_kind": "rms"}, "model.norm_kind"),
    ({"gated_ffn": True}, "model.gated_ffn"),
    ({"bias": False}, "model.bias"),
    ({"attention_scale": False}, "model.attention_scale"),
    ({"head_dim": 8}, "model.head_dim"),
    ({"scale_output": True}, "model.scale_output"),
])
def test_what_ctranslate2_cannot_compute_is_refused_by_its_setting(overrides: dict[str, object], key: str,
                                                                   tmp_path: Path) -> None:
    model, vocabs = tiny(seed=0, shared=True, **overrides)
    with pytest.raises(ConfigError, match=key):
        export_ctranslate2(model, vocabs, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_every_setting_ctranslate2_cannot_compute_is_listed() -> None:
    config = ModelConfig(cross_attention="local", decoder_attention="additive", causal_encoder=True)
    assert [key for key, _ in unsupported(config)] == [
        "model.decoder_attention", "model.cross_attention", "model.causal_encoder"]
    assert unsupported(ModelConfig(norm="pre", positions="learned", tie_output=False)) == []


def test_a_model_extension_is_refused_by_its_own_reason_or_the_engines(tmp_path: Path) -> None:
    """The engine asks the extension: the test extension gives its own reason; one that
    gives none gets the engine's (no place for a task's module in the format)."""
    model, vocabs = tiny(seed=0, shared=True)
    model.extend({"counting": CountingExtension(model.config.d_model)})
    with pytest.raises(ExtensionError, match="extension 'counting' .* counts marks, which no export"):
        export_ctranslate2(model, vocabs, tmp_path / "out")
    plain, _ = tiny(seed=0, shared=True)
    plain.extend({"nothing": ModelExtension()})
    with pytest.raises(ExtensionError, match="'nothing' .* no place for"):
        export_ctranslate2(plain, vocabs, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_without_ctranslate2_the_export_says_what_to_install(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    model, vocabs = tiny(seed=0, shared=True)
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import fails
    with pytest.raises(UsageError, match=r"seqtrans\[export\]"):
        export_ctranslate2(model, vocabs, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_an_interrupted_export_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, vocabs = tiny(seed=0, shared=True)

    def save_half(self: object, directory: str) -> None:
        (Path(directory) / "model.bin").write_bytes(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(ctranslate2.specs.TransformerSpec, "save", save_half)
    with pytest.raises(OSError, match="disk full"):
        export_ctranslate2(model, vocabs, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_output_is_not_touched(tmp_path: Path) -> None:
    model, vocabs = tiny(seed=0, shared=True)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep")
    with pytest.raises(UsageError, match="exists"):
        export_ctranslate2(model, vocabs, tmp_path / "out")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["mine.txt"]


TINY_RUN = ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=32", "model.d_ff=64",
            "model.heads=2", "data.train_size=100", "data.dev_size=4", "data.test_size=4",
            "data.max_length=6", "train.max_steps=2", "train.eval_every=2", "train.checkpoint_every=2",
            "train.max_tokens=256", "train.max_minutes=0"]


def test_export_command_writes_a_model_that_decodes_as_seqtrans_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "seqtrans", "-q", "run", "copy", "--out", str(run),
                           "--device", "cpu", "--set", *TINY_RUN],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert main(["export", str(run), "--to", "ctranslate2", str(tmp_path / "ct2")]) == 0
    assert "wrote" in capsys.readouterr().out

    loaded = load(run, overrides=["decode.beam=1", "decode.max_len_a=0", f"decode.max_len_b={MAX_LEN}"],
                  device="cpu")
    lines = ["3 1 4 1 5", "9 2 6", "5 3 5 8 9 7"]
    ours, _ = loaded.decode([loaded.task.parse_source(line) for line in lines])
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    results = translator.translate_batch([line.split() for line in lines], beam_size=1,
                                         max_decoding_length=MAX_LEN, min_decoding_length=0,
                                         suppress_sequences=[["<pad>"], ["<s>"]])
    assert [r.hypotheses[0] for r in results] == [loaded.codec.target_tokens(o) for o in ours]

    assert main(["export", str(run), "--to", "ctranslate2", str(tmp_path / "ct2")]) == 2
    assert "exists" in capsys.readouterr().err


def test_vocabularies_that_do_not_fit_the_model_are_a_usage_error(tmp_path: Path) -> None:
    model, _ = tiny(seed=0, shared=True)
    other = Vocab(f"x{i}" for i in range(10))
    with pytest.raises(UsageError, match="vocabulary 0 has size 14"):
        export_ctranslate2(model, Vocabularies(other, other), tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
