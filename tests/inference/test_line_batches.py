"""``seqtrans predict``'s input: lines that have arrived are decoded together, a lone line at once."""

from __future__ import annotations

import os
import threading

import pytest

from seqtrans.errors import DataError
from seqtrans.inference.online import line_batches


def test_lines_already_there_come_in_full_batches() -> None:
    read, write = os.pipe()
    os.write(write, b"".join(f"line {i}\n".encode() for i in range(25)) + b"last without end")
    os.close(write)
    batches = list(line_batches(read, max_lines=10))
    os.close(read)
    assert [len(b) for b in batches] == [10, 10, 6]
    assert [line for b in batches for line in b] == [f"line {i}" for i in range(25)] + ["last without end"]


def test_a_line_is_answered_before_the_next_arrives() -> None:
    read, write = os.pipe()
    batches = line_batches(read, max_lines=1000)
    os.write(write, "première\n".encode())
    assert next(batches) == ["première"]  # would block for ever if it waited for more
    os.write(write, b"second\nthird\n")
    assert next(batches) == ["second", "third"]
    sent = threading.Timer(0.2, lambda: (os.write(write, b"fourth\n"), os.close(write)))
    sent.start()
    assert list(batches) == [["fourth"]]
    os.close(read)


def test_invalid_utf8_names_the_line() -> None:
    read, write = os.pipe()
    os.write(write, b"ok\nfine\nbad \xff here\nlost\n")
    os.close(write)
    batches = line_batches(read, max_lines=1)
    assert [next(batches), next(batches)] == [["ok"], ["fine"]]  # the lines before it come first
    with pytest.raises(DataError, match=r"<stdin>:3: invalid UTF-8 at byte 5"):
        next(batches)
    os.close(read)
