from __future__ import annotations

from pathlib import Path

import pytest

from seqtrans.data.vocab import BOS, EOS, PAD, SPECIALS, UNK, Vocab
from seqtrans.errors import DataError


def test_specials_come_first_and_unknown_maps_to_unk() -> None:
    v = Vocab(["a", "b"])
    assert v.symbols[:4] == SPECIALS and (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)
    assert v.encode(["a", "zz", "b"]) == [4, UNK, 5]
    assert v.decode([BOS, 4, 5, EOS, 4]) == ["a", "b"]


def test_build_orders_by_frequency_then_alphabet() -> None:
    v = Vocab.build([["b", "a", "c"], ["c", "b"], ["c"]], max_size=6)
    assert v.symbols[4:] == ("c", "b")


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    v = Vocab(["x", "y"])
    v.save(tmp_path / "v.txt")
    assert Vocab.load(tmp_path / "v.txt") == v


def test_a_malformed_vocabulary_file_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "v.txt"
    path.write_text("<pad>\n<s>\n</s>\n<unk>\na b\n")
    with pytest.raises(DataError, match=r"v.txt:5"):
        Vocab.load(path)
