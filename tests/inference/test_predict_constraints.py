"""Lexical constraints given as text: ``predict``'s constraints file (a JSON line per input
line) and ``decode.banned``, with errors naming the file and line or the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_bad_input import _loaded

from seqtrans.errors import ConfigError, DataError
from seqtrans.inference.lexical import ConstraintLines
from seqtrans.inference.loading import Loaded
from seqtrans.inference.online import predict_batches

SETTINGS = ("decode.beam=4", "decode.max_len_b=6", "decode.max_len_a=0", "decode.min_len=2",
            "decode.constrained=false")


def loaded(tmp_path: Path, *overrides: str) -> Loaded:
    torch.manual_seed(0)  # the same untrained model every time
    return _loaded(tmp_path, *SETTINGS, *overrides)


def contains(output: str, phrase: str) -> bool:
    words, want = output.split(), phrase.split()
    return any(words[i : i + len(want)] == want for i in range(len(words) - len(want) + 1))


def test_each_line_gets_its_own_required_and_banned_phrases(tmp_path: Path) -> None:
    model = loaded(tmp_path)
    inputs = ["1 2 3", "4 5", "6", "1 2 3"]
    free = list(predict_batches(model, [inputs]))
    rules = [{"required": ["3 1"]}, {}, {"required": ["8", "2 1"], "banned": [free[2].split()[0]]},
             {"banned": [free[3].split()[0]]}]
    lines = [json.dumps(r) if r else "" for r in rules]
    constraints = ConstraintLines(lines, "c.jsonl")
    got = list(predict_batches(model, [inputs[:2], inputs[2:]], constraints=constraints))
    assert contains(got[0], "3 1") and not contains(free[0], "3 1")
    assert got[1] == free[1]  # no constraints: as without the file
    assert contains(got[2], "8") and contains(got[2], "2 1") and not contains(got[2], free[2].split()[0])
    assert got[3] and not contains(got[3], free[3].split()[0])


@pytest.mark.parametrize(("line", "problem"), [
    ('{"required": ["7 nine"]}', "required phrase '7 nine': 1 token(s) not in the model's target vocabulary: "
                                 "'-1'"),
    ('{"banned": ["-1"]}', "banned phrase '-1': 1 token(s) not in the model's target vocabulary: '-1'"),
    ('{"required": ["1 2 3", "4 5"]}', "5 required tokens need a beam of at least 5"),
    ('{"required": ["1 2", "3"]}', "3 required tokens do not fit the maximum output length of 2 tokens"),
    ('{"required": "1 2"}', "'required' must be a list of strings"),
    ('{"include": ["1"]}', "unknown key(s) ['include']"),
    ('["1"]', "expected a JSON object"),
    ('{"required": [', "not JSON"),
])
def test_a_line_that_cannot_be_read_or_searched_names_the_file_and_line(tmp_path: Path, line: str,
                                                                       problem: str) -> None:
    model = loaded(tmp_path, "decode.max_len_b=2")
    outputs = []
    constraints = ConstraintLines(["", line, '{"required": ["9"]}'], "c.jsonl")
    with pytest.raises(DataError) as caught:
        for output in predict_batches(model, [["1 2", "3 4", "5"]], constraints=constraints):
            outputs.append(output)
    assert str(caught.value).startswith(f"c.jsonl:2: {problem}")
    assert outputs[0] and outputs[1] == "" and "9" in outputs[2].split()  # the other lines are decoded


def test_the_file_must_have_a_line_per_input(tmp_path: Path) -> None:
    model = loaded(tmp_path)
    with pytest.raises(DataError, match="c.jsonl:2: no line for this input"):
        list(predict_batches(model, [["1", "2"]], constraints=ConstraintLines([""], "c.jsonl")))
    with pytest.raises(DataError, match="c.jsonl:2: more lines than the input"):
        list(predict_batches(model, [["1"]], constraints=ConstraintLines(["", ""], "c.jsonl")))


def test_required_phrases_are_not_sampled(tmp_path: Path) -> None:
    model = loaded(tmp_path, "decode.sample=2")
    with pytest.raises(DataError, match="c.jsonl:1: required phrases need a search"):
        list(predict_batches(model, [["1"]], constraints=ConstraintLines(['{"required": ["2"]}'], "c.jsonl")))


def test_decode_banned_keeps_its_phrases_out_of_every_output(tmp_path: Path) -> None:
    model = loaded(tmp_path)
    inputs = ["1 2 3", "4 5", "6 6 7"]
    free = list(predict_batches(model, [inputs]))
    words = sorted({w for out in free for w in out.split()})
    banned = loaded(tmp_path, f"decode.banned={words[0]},{words[-1]} {words[-1]}")
    assert banned.config.decode.banned == (words[0], f"{words[-1]} {words[-1]}")
    outputs = list(predict_batches(banned, [inputs]))
    assert outputs != free
    assert not any(contains(out, words[0]) or contains(out, f"{words[-1]} {words[-1]}") for out in outputs)
    with pytest.raises(ConfigError, match="decode.banned.*phrase 'nine': 1 token"):
        list(predict_batches(loaded(tmp_path, "decode.banned=nine"), [inputs]))
