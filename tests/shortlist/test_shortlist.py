"""Vocabulary shortlists: IBM Model 1 against a loop written from the paper's formulas,
the file and its vocabulary check, and decoding with ``decode.shortlist``: the whole
vocabulary as the shortlist changes nothing, a small one keeps every output to its
source's tokens (checked against the table by hand), in every search and precision."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from test_inference import TINY_COPY_RUN
from torch import Tensor

from seqtrans.cli import main
from seqtrans.config import DecodeConfig, ModelConfig
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import BOS, EOS, PAD, UNK
from seqtrans.decoding import generate
from seqtrans.decoding.beam import beam_search, greedy_search, sample_search
from seqtrans.decoding.sampling import Truncation, input_uniforms
from seqtrans.errors import CheckpointError, ConfigError
from seqtrans.inference.loading import load
from seqtrans.model.transformer import Transformer
from seqtrans.runtime.system import cpu_features
from seqtrans.shortlist.search import Shortlisted
from seqtrans.shortlist.table import FILE, Shortlist, ShortlistSettings, build
from seqtrans.shortlist.table import load as load_shortlist

V = 40

# Established on processors with AVX-512; on others (AVX2) a search over a shortlist gets
# a sentence's tokens alone as in its batch, its scores equal to rounding only.
SAME_KERNELS = "avx512f" in cpu_features().split()


def pairs(seed: int, count: int = 60) -> tuple[list[list[int]], list[list[int]]]:
    """Sources (ending in EOS) and targets (no EOS) of made-up ids from 4 on."""
    rng = np.random.default_rng(seed)
    src = [rng.integers(4, V, size=rng.integers(1, 7)).tolist() + [EOS] for _ in range(count)]
    tgt = [rng.integers(4, V, size=rng.integers(1, 7)).tolist() for _ in range(count)]
    return src, tgt


def ibm1_reference(src: list[list[int]], tgt: list[list[int]],
                   iterations: int) -> dict[tuple[int, int], float]:
    """t(f | e) of IBM Model 1 (Brown et al. 1993, eq. 2-3 without the empty word), by loops."""
    t: dict[tuple[int, int], float] = defaultdict(lambda: 1.0)
    for _ in range(iterations):
        count: dict[tuple[int, int], float] = defaultdict(float)
        total: dict[int, float] = defaultdict(float)
        for s, f in zip(src, tgt):
            es = [e for e in s if e >= 4]
            for word in [w for w in f if w >= 4]:
                norm = sum(t[e, word] for e in es)
                for e in es:
                    count[e, word] += t[e, word] / norm
                    total[e] += t[e, word] / norm
        t = defaultdict(float, {(e, w): c / total[e] for (e, w), c in count.items()})
    return dict(t)


def test_candidates_are_the_most_probable_targets_of_ibm_model_1() -> None:
    src, tgt = pairs(1)
    shortlist = build(src, tgt, source_size=V, target_size=V, vocabulary="x",
                      settings=ShortlistSettings(top=3, frequent=5, iterations=4))
    table = ibm1_reference(src, tgt, 4)
    for e in range(V):
        ranked = sorted(((p, w) for (s, w), p in table.items() if s == e), key=lambda pw: (-pw[0], pw[1]))
        want = [w for _, w in ranked[:3]]
        assert [c for c in shortlist.candidates[e].tolist() if c >= 0] == want, f"source token {e}"
    counts = np.bincount([w for f in tgt for w in f], minlength=V)
    assert sorted(shortlist.frequent.tolist()) == sorted(np.lexsort((np.arange(V), -counts))[:5].tolist())


def test_a_shortlist_of_another_vocabulary_is_refused_naming_both(tmp_path: Path) -> None:
    src, tgt = pairs(2)
    path = build(src, tgt, source_size=V, target_size=V, vocabulary="a" * 64).save(tmp_path / FILE)
    assert load_shortlist(path, vocabulary="a" * 64).candidates.shape == (V, 50)
    with pytest.raises(CheckpointError, match=f"{FILE}: .*sha256 aaaaaaaaaaaa.* sha256 bbbbbbbbbbbb"):
        load_shortlist(path, vocabulary="b" * 64)
    with pytest.raises(CheckpointError, match="no shortlist"):
        load_shortlist(tmp_path / "missing.npz", vocabulary="a" * 64)


def tiny_model(seed: int) -> Transformer:
    torch.manual_seed(seed)
    config = ModelConfig(encoder_layers=1, decoder_layers=2, d_model=16, d_ff=32, heads=2, dropout=0.0)
    return Transformer(config, source_vocab_size=V, target_vocab_size=V, shared_vocab=True).eval()


def small_shortlist(seed: int) -> Shortlist:
    rng = np.random.default_rng(seed)
    candidates = np.stack([rng.choice(np.arange(4, V), size=2, replace=False) for _ in range(V)])
    return Shortlist(candidates.astype(np.int32), np.array([4], dtype=np.int32), V, "x", ShortlistSettings())


def whole(model: Transformer) -> Shortlist:
    return Shortlist(np.full((V, 1), -1, dtype=np.int32), np.arange(V, dtype=np.int32), V, "x",
                     ShortlistSettings())


SEARCHES = {"greedy": dict(beam=1), "beam 4": dict(beam=4), "n-best": dict(beam=4, nbest=3),
            "sampling": dict(sample=2, seed=3), "int8 beam": dict(beam=3, precision="int8")}


def decode(model: Transformer, shortlist: Shortlist | None,
           **settings: object) -> list[list[tuple[list[int], float]]]:
    sources = pairs(5, count=9)[0]
    config = DecodeConfig(max_len_a=0, max_len_b=8, shortlist=shortlist is not None, **settings)  # type: ignore[arg-type]
    out = generate(model, sources, config, device=torch.device("cpu"), shortlist=shortlist)
    return [[(h.tokens, h.score) for h in hyps] for hyps in out]


@pytest.mark.parametrize("search", list(SEARCHES))
def test_the_whole_vocabulary_as_shortlist_changes_nothing(search: str) -> None:
    model = tiny_model(1)
    listed = decode(model, whole(model), **SEARCHES[search])
    free = decode(model, None, **SEARCHES[search])
    def outputs(decoded: list[list[tuple[list[int], float]]]) -> list[list[list[int]]]:
        return [[tokens for tokens, _ in hyps] for hyps in decoded]

    assert outputs(listed) == outputs(free)
    # a shortlist's beam takes the scores path, the free beam its candidates straight from
    # the logits (seqtrans.decoding.search.fused_candidates): the same sums in another order
    assert [score for hyps in listed for _, score in hyps] == pytest.approx(
        [score for hyps in free for _, score in hyps], abs=1e-5)


@pytest.mark.parametrize("search", list(SEARCHES))
def test_every_output_keeps_to_its_sources_candidates(search: str) -> None:
    model, shortlist = tiny_model(2), small_shortlist(3)
    sources = pairs(5, count=9)[0]
    free = decode(model, None, **SEARCHES[search])
    restricted = decode(model, shortlist, **SEARCHES[search])
    for source, hyps in zip(sources, restricted):
        allowed = {EOS, UNK, 4} | {int(c) for token in source for c in shortlist.candidates[token]}
        assert hyps and all(set(tokens) <= allowed for tokens, _ in hyps)
    outside = [t for hyps in free for tokens, _ in hyps for t in tokens]
    assert outside and restricted != free  # the random model does go outside them


class NoTwiceInARow:
    """A task's constraint that reads the prefix: no token right after itself, and an
    odd token only in the rows of odd sources (the end symbol always)."""

    def allowed(self, prefix: Tensor, *, rows: Tensor, remaining: Tensor) -> Tensor:
        ids = torch.arange(V)
        even, own = ids.unsqueeze(0) % 2 == 0, rows.unsqueeze(1) % 2 == 1
        mask = even | own | (ids.unsqueeze(0) == EOS)  # [N, V]
        if prefix.size(1):
            mask &= ids.unsqueeze(0) != prefix[:, -1:]
        return mask


RULES = {"plain": {}, "min length": dict(min_len=3), "no repeated bigram": dict(no_repeat_ngram_size=2),
         "prefixes": dict(prefixes=[[7, 9], [], [5]]), "banned": dict(banned=[[[4]], [], [[9, 4], [11]]]),
         "constraint": dict(constraint=NoTwiceInARow())}


@pytest.mark.parametrize("rules", list(RULES))
@pytest.mark.parametrize("search", ["greedy", "beam", "sampling"])
def test_searching_the_shortlists_columns_equals_searching_the_whole_vocabulary(search: str,
                                                                                rules: str) -> None:
    """The search ranks the shortlist's columns only (what decode.shortlist runs); the
    reference is the same model's logits spread over the whole vocabulary, -inf outside."""
    model = tiny_model(4)
    # padding and the start symbol among its columns, which the search must still never emit
    shortlist = dataclasses.replace(small_shortlist(5), frequent=np.array([PAD, BOS, 4], dtype=np.int32))
    sources = pairs(6, count=3)[0]
    settings: dict[str, object] = dict(RULES[rules])
    prefixes = settings.pop("prefixes", None)
    extra = prefixes if isinstance(prefixes, list) else None
    src = pad_batch(sources)
    max_len = torch.full((3,), 7)
    if prefixes is not None:
        settings["prefixes"] = pad_batch(prefixes) if any(prefixes) else None
    outputs = []
    for compact in (True, False):
        searcher = Shortlisted(model, shortlist, extra=extra, compact=compact)
        if search == "greedy":
            out = greedy_search(searcher, src, max_len=max_len, **settings)  # type: ignore[arg-type]
        elif search == "beam":
            out = beam_search(searcher, src, beam=3, alpha=0.6, max_len=max_len, nbest=2,
                              **settings)  # type: ignore[arg-type]
        else:
            uniforms = input_uniforms(1, range(3), samples=1, steps=[8, 8, 8])
            out = sample_search(searcher, src, max_len=max_len, uniforms=uniforms,
                                truncation=Truncation(top_k=3), **settings)  # type: ignore[arg-type]
        outputs.append([[(h.tokens, h.log_prob) for h in hyps] for hyps in out])
    compact_out, whole_out = outputs
    assert [[t for t, _ in hyps] for hyps in compact_out] == [[t for t, _ in hyps] for hyps in whole_out]
    assert all(hyps for hyps in compact_out)
    for a, b in zip(compact_out, whole_out):
        assert [lp for _, lp in a] == pytest.approx([lp for _, lp in b], abs=1e-5)


@pytest.mark.parametrize("search", ["greedy", "beam 4", "int8 beam", "sampling"])
def test_a_sentence_gets_the_same_bits_alone_as_in_its_batch_with_a_shortlist(search: str) -> None:
    """Its batch-mates change the batch's columns, not where its own tokens sit in the
    softmax: the scores are equal to the last bit."""
    model = Transformer(ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2,
                                    dropout=0.0), source_vocab_size=300, target_vocab_size=300,
                        shared_vocab=True).eval()
    rng = np.random.default_rng(7)
    candidates = np.stack([rng.choice(np.arange(4, 300), size=40, replace=False) for _ in range(300)])
    shortlist = Shortlist(candidates.astype(np.int32), np.arange(4, 30, dtype=np.int32), 300, "x",
                          ShortlistSettings())
    sources = [rng.integers(4, 300, size=rng.integers(1, 9)).tolist() + [EOS] for _ in range(8)]
    config = DecodeConfig(max_len_a=0, max_len_b=6, shortlist=True, **SEARCHES[search])  # type: ignore[arg-type]
    batch = generate(model, sources, config, device=torch.device("cpu"), shortlist=shortlist)
    for i, (source, hyps) in enumerate(zip(sources, batch)):
        alone = generate(model, [source], config, device=torch.device("cpu"), shortlist=shortlist,
                         positions=[i])[0]
        assert [h.tokens for h in alone] == [h.tokens for h in hyps]
        if SAME_KERNELS:
            assert [h.score for h in alone] == [h.score for h in hyps]
        else:  # without AVX-512 some kernel of a step sums in another order in a batch (not found)
            assert [h.score for h in alone] == pytest.approx([h.score for h in hyps], rel=1e-6)


def test_without_a_shortlist_decode_shortlist_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="decode.shortlist"):
        generate(tiny_model(0), [[5, EOS]], DecodeConfig(shortlist=True), device=torch.device("cpu"))


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("shortlist") / "run"
    done = subprocess.run([sys.executable, "-m", "seqtrans", "-q", "run", "copy", "--out", str(run),
                           "--device", "cpu", "--set", *TINY_COPY_RUN],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return run


def test_a_trained_runs_shortlist_restricts_its_outputs_and_exports_as_ctranslate2s_map(
        copy_run: Path, tmp_path: Path) -> None:
    ctranslate2 = pytest.importorskip("ctranslate2")
    assert main(["shortlist", str(copy_run), "--top", "1", "--frequent", "1"]) == 0
    shortlist = load(copy_run, overrides=["decode.shortlist=true"], device="cpu").shortlist
    assert shortlist is not None and (copy_run / FILE).is_file()
    loaded = load(copy_run, overrides=["decode.shortlist=true", "decode.beam=2"], device="cpu")
    lines = ["3 1 4 1 5", "9 2 6", "5 3 5 8 9 7", "0 0 0"]
    vocab = loaded.codec.vocabularies

    def allowed(line: str) -> set[str]:
        ids = {int(c) for t in line.split() for c in shortlist.candidates[vocab.source.index(t)] if c >= 0}
        return {vocab.target.symbols[i] for i in ids | set(shortlist.frequent.tolist())} | {"</s>", "<unk>"}

    outputs, _ = loaded.decode([loaded.task.parse_source(line) for line in lines])
    for line, output in zip(lines, outputs):
        assert set(loaded.codec.target_tokens(output)) <= allowed(line), line

    assert main(["export", str(copy_run), "--to", "ctranslate2", str(tmp_path / "ct2")]) == 0
    assert (tmp_path / "ct2" / "vmap.txt").is_file()
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    for line in lines:  # one at a time: CTranslate2 allows the batch's union
        result = translator.translate_batch([line.split()], beam_size=2, use_vmap=True, max_decoding_length=8,
                                            suppress_sequences=[["<pad>"], ["<s>"]])
        assert set(result[0].hypotheses[0]) <= allowed(line), line


def test_a_run_whose_shortlist_was_built_for_another_vocabulary_is_refused(copy_run: Path,
                                                                           tmp_path: Path) -> None:
    path = copy_run / FILE
    if not path.is_file():
        assert main(["shortlist", str(copy_run)]) == 0
    kept = path.read_bytes()
    try:
        digest = load(copy_run, device="cpu").vocabulary_digest
        other = dataclasses.replace(load_shortlist(path, vocabulary=digest), vocabulary="c" * 64)
        other.save(path)
        with pytest.raises(CheckpointError, match="sha256 cccccccccccc"):
            load(copy_run, overrides=["decode.shortlist=true"], device="cpu")
        assert main(["export", str(copy_run), "--to", "ctranslate2", str(tmp_path / "ct2")]) == 1
    finally:
        path.write_bytes(kept)


def test_a_run_with_decode_shortlist_builds_its_shortlist_and_decodes_its_test_split_with_it(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "seqtrans", "-q", "run", "copy", "--out", str(run),
                           "--device", "cpu", "--set", *TINY_COPY_RUN, "decode.shortlist=true"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    loaded = load(run, device="cpu")
    shortlist = load_shortlist(run / FILE, vocabulary=loaded.vocabulary_digest)
    vocab = loaded.codec.vocabularies
    test = [e for e in loaded.task.read("test") if hasattr(e, "source")]
    predictions = (run / "predictions" / "test.txt").read_text().splitlines()
    assert len(predictions) == len(test) > 0
    for example, line in zip(test, predictions):
        ids = [vocab.source.index(t) for t in loaded.codec.source_tokens(example.source)]
        allowed = shortlist.allowed([ids])[0]
        assert all(allowed[vocab.target.index(t)] for t in line.split()), line
