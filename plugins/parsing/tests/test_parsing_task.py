"""The parsing task: the plugin contract, constrained decoding, a tiny end-to-end run."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

import seqtrans
from parsing_data import SAMPLE, use_shared_nltk_data
from seqtrans import Loaded, RunConfig, Transformer, build_model
from seqtrans.data.batches import target_ids  # internal: a reference's ids, as the engine makes them
from seqtrans.plugin import UNK, ConfigError, DecodeConfig, Example, ModelConfig, check_task
from seqtrans_parsing import ParsingCodec, ParsingConfig, ParsingTask
from seqtrans_parsing.cursor import SpanCursor
from seqtrans_parsing.linearize import linearize
from seqtrans_parsing.task import PTB_TAGS
from seqtrans_parsing.trees import read_trees


@pytest.fixture(autouse=True)
def _nltk_data(monkeypatch: pytest.MonkeyPatch) -> None:
    use_shared_nltk_data(monkeypatch)


def with_cursors(codec: ParsingCodec, *, span: bool = False) -> ParsingCodec:
    """The codec with the source cursor (and the span cursor) on, as data.source_cursor
    (data.span_cursor) makes it."""
    return replace(codec, source_cursor=True, span_cursor=span)


def test_the_task_is_found_by_name_and_keeps_the_contract(tmp_path: Path) -> None:
    assert seqtrans.tasks.load("parsing") is ParsingTask
    scores = check_task(ParsingTask(ParsingConfig(vocab_size=300)), tmp_path)
    assert scores["f1"] == 100.0 and scores["malformed"] == 0.0 and scores["evalb_errors"] == 0.0


def test_the_paper_decoding_defaults_and_the_presets() -> None:
    config = seqtrans.resolve_config("parsing")
    assert (config.decode.beam, config.decode.alpha, config.decode.max_len_a, config.decode.max_len_b) \
        == (21, 0.3, 1.0, 300)
    wsj = seqtrans.resolve_config("parsing", preset="wsj")
    assert (wsj.model.encoder_layers, wsj.model.d_model, wsj.data.vocab_size) == (4, 1024, 16000)
    assert wsj.data.preterminals == "placeholder" and not wsj.data.source_cursor
    cpu = seqtrans.resolve_config("parsing", preset="cpu")
    assert cpu.train.max_minutes == 30
    for sample in (config, cpu):
        assert sample.data.preterminals == "tags" and sample.data.source_cursor
        assert (sample.model.dropout, sample.model.attention_dropout) == (0.1, 0.0)
        assert (sample.train.lr_scale, sample.train.subword_sampling) == (0.7, 0.2)
        assert sample.data.substitute == 0


def _small_task(tmp_path: Path, **options: Any) -> tuple[ParsingTask, ParsingCodec, list[Example]]:
    task = ParsingTask(ParsingConfig(vocab_size=200, train=str(SAMPLE / "dev.trees"), **options))
    train = [e for e in task.read("train") if isinstance(e, Example)]
    codec = task.build_vocabulary(tmp_path, train)
    return task, codec, train


def _loaded(task: ParsingTask, codec: ParsingCodec, model: Transformer) -> Loaded:
    """A model built here with its task and codec, decoding as a loaded run decodes."""
    return Loaded(RunConfig(task="parsing", data=task.config), task, codec, model, torch.device("cpu"))


def _assert_constrained_trees(loaded: Loaded, sources: list[Any], beam: int) -> None:
    """Constrained decoding at ``beam`` gives trees over exactly the words, none repaired."""
    preds, _ = loaded.decode(sources, decode=DecodeConfig(beam=beam, max_len_a=1.0, max_len_b=10))
    assert all(p.repairs == 0 for p in preds)
    assert [p.tree.leaves() for p in preds] == [list(s.words) for s in sources]


def _seeded_parser(tmp_path: Path) -> tuple[Loaded, list[Any]]:
    """An untrained seeded model of the small task, and three of its sources."""
    task, codec, train = _small_task(tmp_path)
    torch.manual_seed(1)
    model = build_model(ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2,
                                    dropout=0.0, share_embeddings=False), codec).eval()
    return _loaded(task, codec, model), sorted((e.source for e in train), key=lambda s: len(s.words))[:6:2]


def test_constrained_outputs_are_well_formed_and_unconstrained_ones_are_repaired(tmp_path: Path) -> None:
    loaded, sources = _seeded_parser(tmp_path)
    for beam in (1, 3):
        _assert_constrained_trees(loaded, sources, beam)
        free, _ = loaded.decode(sources, decode=DecodeConfig(beam=beam, max_len_b=10, constrained=False))
        assert sum(p.repairs for p in free) > 0
        assert [p.tree.leaves() for p in free] == [list(s.words) for s in sources]


def test_required_phrases_keep_the_bracket_constraint(tmp_path: Path) -> None:
    loaded, sources = _seeded_parser(tmp_path)
    phrase = [loaded.codec.vocabularies.target.index(t) for t in ("(NP", "(VP")]
    assert UNK not in phrase
    decode = DecodeConfig(beam=3, max_len_a=1.0, max_len_b=10)
    free, free_hyps = loaded.decode(sources, decode=decode)
    preds, hyps = loaded.decode(sources, decode=decode, required=[[phrase[:1], phrase[1:]]] * len(sources))
    assert all(set(phrase) <= set(h[0].tokens) for h in hyps)
    assert any(not set(phrase) <= set(h[0].tokens) for h in free_hyps)  # the phrases change the parses
    assert all(p.repairs == 0 for p in preds)  # still well-formed trees over exactly the words
    assert [p.tree.leaves() for p in preds] == [list(s.words) for s in sources]


def test_each_word_starts_exactly_one_source_unit_for_the_cursor(tmp_path: Path) -> None:
    """The source cursor counts words by their first pieces: one per word, also for words
    whose first piece the vocabulary lacks (an unseen character)."""
    task, codec, train = _small_task(tmp_path)
    walk = codec.source_walk()
    assert walk.advance == (codec.vocabularies.target.index("XX"),)
    starts = set(walk.starts)
    sources = [e.source for e in train] + [task.parse_source("\u03a9mega saw \u00e6ther ( 1956 ) .")]
    for source in sources:
        ids = codec.vocabularies.source.encode(codec.source_tokens(source))
        assert sum(i in starts for i in ids) == len(source.words), source.words
    # a model with the cursor decodes well-formed trees over exactly the words
    torch.manual_seed(1)
    model = build_model(ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2,
                                    dropout=0.0, share_embeddings=False), with_cursors(codec)).eval()
    some = sources[:3] + sources[-1:]
    preds, _ = _loaded(task, codec, model).decode(some, decode=DecodeConfig(beam=3, max_len_b=10))
    assert [p.tree.leaves() for p in preds] == [list(s.words) for s in some]
    assert all(p.repairs == 0 for p in preds)


def test_brackets_are_the_walks_spans_for_the_span_cursor(tmp_path: Path) -> None:
    """"(X" opens a span, ")X" closes one; right after each "(X" the innermost open span
    starts at the word after those already placed; a model with both cursors decodes
    well-formed trees over exactly the words."""
    task, codec, train = _small_task(tmp_path)
    walk = codec.source_walk()
    target = codec.vocabularies.target
    assert sorted(target.symbols[i] for i in walk.opens) == sorted(s for s in target.symbols if s[:1] == "(")
    assert sorted(target.symbols[i] for i in walk.closes) == sorted(s for s in target.symbols if s[:1] == ")")
    torch.manual_seed(1)
    model = build_model(ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2,
                                    dropout=0.0, share_embeddings=False),
                        with_cursors(codec, span=True)).eval()
    span_cursor = model.extensions["span_cursor"]
    assert isinstance(span_cursor, SpanCursor)
    for example in train[:5]:
        tokens = codec.target_tokens(example.target)
        starts = span_cursor.span_starts(torch.tensor([target.encode(tokens)]))[0].tolist()
        opened = [(i, sum(t == "XX" for t in tokens[:i])) for i, t in enumerate(tokens) if t[0] == "("]
        assert [starts[i] for i, _ in opened] == [words for _, words in opened]
        assert starts[-1] == -1  # the whole tree closed
    sources = [e.source for e in train[:3]]
    preds, _ = _loaded(task, codec, model).decode(sources, decode=DecodeConfig(beam=3, max_len_b=10))
    assert [p.tree.leaves() for p in preds] == [list(s.words) for s in sources]
    assert all(p.repairs == 0 for p in preds)


def test_an_in_order_target_declares_no_spans_and_refuses_the_span_cursor(tmp_path: Path) -> None:
    """In in-order output "(X" comes after its first child: the word the cursor stands at is
    not where the span starts, so the walk declares no spans and the setting is refused."""
    _, codec, _ = _small_task(tmp_path, linearization="in_order")
    walk = codec.source_walk()
    assert walk.advance and walk.starts and not walk.opens and not walk.closes
    with pytest.raises(ConfigError, match="data.span_cursor.*data.linearization=top_down"):
        ParsingConfig(linearization="in_order", span_cursor=True)
    with pytest.raises(ValueError, match="declares spans"):  # a codec made by hand is refused too
        build_model(ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2),
                    with_cursors(codec, span=True))


def test_sampled_segmentations_vary_by_seed_and_keep_one_start_per_word(tmp_path: Path) -> None:
    task, codec, train = _small_task(tmp_path)
    starts = set(codec.source_walk().starts)
    sources = [e.source for e in train]
    fixed = [codec.source_tokens(s) for s in sources]
    first = codec.sample_source_tokens(sources, 0.3, seed=5)
    assert codec.sample_source_tokens(sources, 0.3, seed=5) == first  # reproducible
    assert codec.sample_source_tokens(sources, 0.3, seed=6) != first
    changed = sum(a != b for a, b in zip(first, fixed))
    assert changed > len(sources) // 2
    for tokens, source in zip(first, sources):
        assert "".join(tokens).replace("\u2581", " ").split() == list(source.words)
        ids = codec.vocabularies.source.encode(tokens)
        assert sum(i in starts for i in ids) == len(source.words)
        assert UNK not in ids
    # a larger alpha stays closer to the most likely segmentation
    near = codec.sample_source_tokens(sources, 5.0, seed=5)
    assert sum(a != b for a, b in zip(near, fixed)) < changed


def test_a_tagging_target_writes_tags_walks_the_cursor_on_them_and_decodes_trees(tmp_path: Path) -> None:
    task, codec, train = _small_task(tmp_path, preterminals="tags")
    tags = set(PTB_TAGS) | {t for e in train for t in e.source.tags or ()}
    target = codec.vocabularies.target
    assert {s for s in target.symbols if s[0] not in "(<)"} == tags and "XX" not in target
    assert sorted(codec.source_walk().advance) == sorted(target.index(t) for t in tags)
    example = train[0]
    tokens = codec.target_tokens(example.target)
    assert [t for t in tokens if t in tags] == list(example.source.tags or ())
    torch.manual_seed(1)
    model = build_model(ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2,
                                    dropout=0.0, share_embeddings=False), with_cursors(codec)).eval()
    sentence = task.parse_source("The dog barked .")  # no gold tags: the tree has the decoded ones
    preds, _ = _loaded(task, codec, model).decode([sentence], decode=DecodeConfig(beam=3, max_len_b=10))
    leaves = preds[0].tree.tagged()
    assert preds[0].repairs == 0 and [w for _, w in leaves] == list(sentence.words)
    assert all(t in tags for t, _ in leaves)
    # tagging accuracy over every word: one sentence right, one with its last tag missing
    a, b = train[:2]
    assert a.source.tags and b.source.tags
    preds = [codec.prediction(codec.target_tokens(e.target), e.source) for e in (a, b)]
    assert [p.preterminals for p in preds] == [a.source.tags, b.source.tags]
    short = replace(preds[1], preterminals=b.source.tags[:-1])
    words = len(a.source.tags) + len(b.source.tags)
    assert task.score([preds[0], short], [a, b])["tag_accuracy"] == round((words - 1) / words * 100, 2)
    (tmp_path / "xx").mkdir()
    assert "tag_accuracy" not in _small_task(tmp_path / "xx")[0].score(preds, [a, b])
    # a saved run loads the same preterminals back
    loaded = ParsingTask(task.config)
    assert loaded.load_vocabulary(tmp_path).source_walk() == codec.source_walk()


def _first_trees(path: Path, n: int, out: Path) -> Path:
    out.write_text("".join(path.read_text().splitlines(keepends=True)[:n]))
    return out


def test_a_tiny_run_end_to_end_and_predict(tmp_path: Path) -> None:
    train = _first_trees(SAMPLE / "dev.trees", 200, tmp_path / "train.trees")
    dev = _first_trees(SAMPLE / "dev.trees", 5, tmp_path / "dev.trees")
    test = _first_trees(SAMPLE / "test.trees", 12, tmp_path / "test.trees")
    with test.open("a") as f:
        f.write("(S (NN broken)\n")  # malformed: left out and counted for the test split alone
    config = seqtrans.resolve_config("parsing", overrides=[
        f"data.train={train}", f"data.dev={dev}", f"data.test={test}", "data.vocab_size=200",
        "data.malformed=skip",
        "model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=16", "model.d_ff=32",
        "model.heads=2", "train.max_steps=3", "train.eval_every=3", "train.checkpoint_every=3",
        "train.average_last=1", "train.keep_checkpoints=1", "train.valid_max_examples=5",
        "decode.beam=2", "decode.max_len_b=10", "train.subword_sampling=0.3"])
    metrics = seqtrans.run(config, tmp_path / "run", device="cpu")
    expected = {"f1", "recall", "precision", "malformed", "unconstrained_malformed", "unconstrained_f1"}
    assert expected <= set(metrics)
    assert metrics["malformed"] == 0.0 and metrics["evalb_errors"] == 0.0
    assert all(isinstance(v, float | int) for v in metrics.values())
    lines = (tmp_path / "run" / "predictions" / "test.txt").read_text().splitlines()
    assert len(lines) == 12 and all(line.startswith("(TOP ") for line in lines)
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["test_sentences"] == 12
    assert metrics["skipped"] == 1
    again = seqtrans.evaluate(tmp_path / "run", split="test", device="cpu")
    assert again["skipped"] == 1 and again["f1"] == metrics["f1"]
    assert seqtrans.evaluate(tmp_path / "run", split="dev", device="cpu")["skipped"] == 0

    loaded = seqtrans.load(tmp_path / "run", device="cpu")
    (out,) = list(seqtrans.predict(loaded, ["The dog ( barked ) ."]))
    assert out.startswith("(TOP ")
    ((tree, _),) = read_trees(out)
    assert tree.leaves() == ["The", "dog", "-LRB-", "barked", "-RRB-", "."]
    # the default preset predicts tags: the printed tree carries the decoded ones
    tags = set((tmp_path / "run" / "vocab" / "target.vocab").read_text().split())
    assert all(tag in tags and tag[0] not in "()" for tag, _ in tree.tagged())


def test_an_in_order_target_round_trips_and_decodes_well_formed_trees(tmp_path: Path) -> None:
    task, codec, train = _small_task(tmp_path, preterminals="tags", linearization="in_order")
    (tmp_path / "top_down").mkdir()
    _, top_down, _ = _small_task(tmp_path / "top_down", preterminals="tags")
    assert (codec.order, top_down.order) == ("in_order", "top_down")
    # the same vocabulary: every order writes the same labels
    assert codec.vocabularies.target.symbols == top_down.vocabularies.target.symbols
    for e in train:
        tokens = codec.target_tokens(e.target)
        assert tokens == linearize(e.target, tags=True, order="in_order") != top_down.target_tokens(e.target)
        assert target_ids(codec, e.target) == codec.vocabularies.target.encode(tokens)
        pred = codec.prediction(tokens, e.source)
        assert pred.repairs == 0 and str(pred.tree) == str(e.target)
        assert pred.preterminals == e.source.tags
    assert codec.constraint([e.source for e in train[:2]]).order == "in_order"
    torch.manual_seed(1)
    model = build_model(ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2,
                                    dropout=0.0, share_embeddings=False), with_cursors(codec)).eval()
    sources = sorted((e.source for e in train), key=lambda s: len(s.words))[:8:2]
    for beam in (1, 3):
        _assert_constrained_trees(_loaded(task, codec, model), sources, beam)
    # a saved run loads the same order back
    assert ParsingTask(task.config).load_vocabulary(tmp_path).order == "in_order"


def test_a_tiny_in_order_run(tmp_path: Path) -> None:
    train = _first_trees(SAMPLE / "dev.trees", 60, tmp_path / "train.trees")
    dev = _first_trees(SAMPLE / "dev.trees", 3, tmp_path / "dev.trees")
    test = _first_trees(SAMPLE / "test.trees", 5, tmp_path / "test.trees")
    run = tmp_path / "run"
    config = seqtrans.resolve_config("parsing", overrides=[
        f"data.train={train}", f"data.dev={dev}", f"data.test={test}", "data.vocab_size=200",
        "data.linearization=in_order", "model.encoder_layers=1", "model.decoder_layers=1",
        "model.d_model=16", "model.d_ff=32", "model.heads=2", "train.max_steps=2",
        "train.eval_every=2", "train.checkpoint_every=2", "train.average_last=1",
        "train.keep_checkpoints=1", "train.valid_max_examples=3", "decode.beam=2", "decode.max_len_b=10"])
    seqtrans.run(config, run, device="cpu")
    metrics = json.loads((run / "metrics.json").read_text())
    # constrained outputs are well-formed in-order sequences (read back in order, no repairs)
    assert metrics["malformed"] == 0.0 and metrics["evalb_errors"] == 0.0 and metrics["test_sentences"] == 5
    loaded = seqtrans.load(run, device="cpu")
    assert loaded.config.data.linearization == "in_order" and loaded.codec.order == "in_order"
    lines = (run / "predictions" / "test.txt").read_text().splitlines()
    assert len(lines) == 5 and all(line.startswith("(TOP ") for line in lines)
    # a reference tree reads into in-order ids
    target = loaded.target_ids("(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))")
    assert loaded.codec.vocabularies.target.decode(target) == "DT (NP NN )NP (S VBD (VP )VP . )S".split()


def test_a_target_line_is_read_as_one_preprocessed_tree() -> None:
    from seqtrans.plugin import DataError

    task = ParsingTask(ParsingConfig())
    tree = task.parse_target("( (S (NP-SBJ (-NONE- *T*-1) (DT The) (NN dog)) (VP (VBD barked)) (. .)) )")
    assert str(tree) == str(next(read_trees("(S (NP (DT The) (NN dog)) (VP (VBD barked)) (. .))"))[0])
    with pytest.raises(DataError, match="must hold one tree, not 2"):
        task.parse_target("(S (NN a)) (S (NN b))")
    with pytest.raises(DataError, match="only empty elements"):
        task.parse_target("(S (-NONE- *))")
