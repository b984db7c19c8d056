"""EVALB: the reference program's outputs reproduced byte for byte, and its documented
behaviours, with the fast paths checked against the program's literal loops."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from parsing_data import SHARED_DATA
from seqtrans import cli  # internal: the plugin's command run through the command line in this process
from seqtrans_parsing.evalb import COLLINS, Parameters, evalb, parse_parameters, read_parameters

EVALB = SHARED_DATA / "evalb"

CASES = [  # gold, test, parameter file, reference output
    ("sample.gld", "sample.tst", "sample.prm", "sample.out-sample_prm"),
    ("sample.gld", "sample.tst", "COLLINS.prm", "sample.out-COLLINS_prm"),
    ("bug/bug.gld", "bug/bug.tst", "new.prm", "bug/bug.out-new_prm"),
    ("bug/bug.gld", "bug/bug.tst", "COLLINS.prm", "bug/bug.out-COLLINS_prm"),
]


@pytest.mark.parametrize(("gold", "test", "prm", "reference"), CASES)
def test_the_command_prints_what_the_reference_program_prints(
        capsysbinary: pytest.CaptureFixture[bytes], gold: str, test: str, prm: str, reference: str) -> None:
    code = cli.main(["evalb", str(EVALB / gold), str(EVALB / test), "-p", str(EVALB / prm)])
    out, err = capsysbinary.readouterr()
    assert code == 0
    assert out == (EVALB / f"{reference}.rsl").read_bytes()
    assert err == (EVALB / f"{reference}.stderr").read_bytes()


def test_the_command_imports_neither_torch_nor_the_task() -> None:
    heavy = "('torch', 'seqtrans_parsing.task', 'sentencepiece', 'nltk')"
    probe = ("import atexit, sys; from seqtrans.cli import main; atexit.register(lambda: sys.stderr.write("
             f"str(sorted(m for m in {heavy} if m in sys.modules)))); sys.exit(main(sys.argv[1:]))")
    done = subprocess.run([sys.executable, "-c", probe, "evalb", "--collins", str(EVALB / "sample.gld"),
                           str(EVALB / "sample.tst")], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("  Sent.")
    assert done.stderr.endswith("[]"), done.stderr


def test_the_built_in_collins_parameters(capsysbinary: pytest.CaptureFixture[bytes]) -> None:
    assert cli.main(["evalb", "--collins", str(EVALB / "sample.gld"), str(EVALB / "sample.tst")]) == 0
    out, err = capsysbinary.readouterr()
    assert out == (EVALB / "sample.out-COLLINS_prm.rsl").read_bytes()
    assert err == (EVALB / "sample.out-COLLINS_prm.stderr").read_bytes()


def _numbers(line: str) -> list[str]:
    return line.split()


def test_the_per_sentence_lines_equal_the_distributed_results_where_the_readme_says_they_do() -> None:
    params, _ = read_parameters(EVALB / "new.prm")
    report = evalb((EVALB / "bug/bug.gld").read_text(), (EVALB / "bug/bug.tst").read_text(), params)
    shipped = (EVALB / "bug/bug.rsl-new").read_text().splitlines()
    assert [_numbers(r.line()) for r in report.sentences] == [_numbers(x) for x in shipped[3:8]]
    # sample.rsl (older binary): every line but the Words column of errors and skips
    params, _ = read_parameters(EVALB / "sample.prm")
    report = evalb((EVALB / "sample.gld").read_text(), (EVALB / "sample.tst").read_text(), params)
    shipped = (EVALB / "sample.rsl").read_text().splitlines()[3:27]
    for r, old in zip(report.sentences, shipped):
        ours, theirs = _numbers(r.line()), _numbers(old)
        if r.status:
            ours[9], theirs[9] = "-", "-"
        assert ours == theirs
    assert (report.all.recall, report.all.precision) == pytest.approx((87.7551, 90.5263), abs=1e-4)


def test_collins_parameters_equal_collins_prm() -> None:
    params, warnings = read_parameters(EVALB / "COLLINS.prm")
    assert params == COLLINS and warnings == []
    sample, _ = read_parameters(EVALB / "sample.prm")
    assert sample.eq_words == (("This", "this"),) and sample.eq_labels == (("T", "TT"),)
    assert "." not in sample.delete_labels and sample.delete_labels_for_length == ("-NONE-",)


def test_the_parameter_reader_reports_what_the_program_reports() -> None:
    params, warnings = parse_parameters(
        "# comment\nLABELED 0\nMAX_ERROR  3 \nEQ_LABEL A B C\nFOO 1\nDEBUG\nx\nDELETE_LABEL_FOR_LENGTH X\n")
    assert not params.labeled and params.max_error == 3 and params.debug == 0
    assert params.eq_labels == () and params.delete_labels_for_length == ("X",)
    assert warnings == ["EQ_LABEL requires two values\n", "Unknown keyword (FOO 1) in parameter file\n",
                        "Empty value in parameter file (6)\n"]


def _run(gold: list[str], test: list[str], **params: object) -> tuple[list[tuple], object]:
    report = evalb(gold, test, Parameters(**params))  # type: ignore[arg-type]
    rows = [(r.status, r.matched, r.gold_brackets, r.test_brackets, r.crossing, r.words, r.correct_tags)
            for r in report.sentences]
    return rows, report


def test_function_tags_deleted_preterminals_and_the_empty_root() -> None:
    gold = ["( (S (NP-SBJ-1 (DT the) (NN dog)) (VP=2 (VBD barked) (NP (-NONE- *T*))) (. .)))"]
    test = ["(TOP (S (NP (DT the) (NN dog)) (VP (VBD barked)) (. .)))"]
    rows, report = _run(gold, test, delete_labels=COLLINS.delete_labels,
                        delete_labels_for_length=("-NONE-",))
    # the empty root is a bracket TOP does not delete; -NONE- and '.' go with their words
    assert rows == [(0, 3, 4, 3, 0, 3, 3)]
    assert report.sentences[0].length == 4  # '.' counts for the length, -NONE- does not


def test_a_label_starting_with_a_dash_becomes_empty() -> None:
    rows, _ = _run(["(S (-X (A a)) (B b))"], ["(S ( (A a)) (B b))"])
    assert rows == [(0, 2, 2, 2, 0, 2, 2)]


def test_duplicate_brackets_match_min_n_m() -> None:
    gold = ["(S (A (A (A (P x)))) (B y))"]
    test = ["(S (A (P x)) (B y))", "(S (A (A (A (A (A (P x)))))) (B y))"]
    rows, _ = _run(gold * 2, test)
    assert [r[1:4] for r in rows] == [(2, 4, 2), (4, 4, 6)]  # S, and min(3, 1) or min(3, 5) of A


def test_errors_skips_and_the_length_cut_off() -> None:
    long = "(S " + " ".join(f"(X w{i})" for i in range(41)) + ")"
    gold = ["(S (X a) (X b))", "(S (X a) (X b))", "(S (X a) (X b))", long]
    test = ["(S (X a) (X c))", "", "(S (X a))", long]
    rows, report = _run(gold, test)
    assert [r[0] for r in rows] == [1, 2, 1, 0]
    assert report.messages == ["1 : Words unmatch (b|c)\n", "3 : Length unmatch (2|1)\n"]
    assert (report.all.valid, report.short.valid, report.short.sentences) == (1, 0, 3)


def test_more_errors_than_max_error_stop_the_program() -> None:
    gold = ["(S (X a))"] * 6
    test = ["(S (X b))"] * 6
    report = evalb(gold, test, Parameters(max_error=2))
    assert report.aborted and len(report.messages) == 4 and len(report.sentences) == 3
    assert "Summary" not in report.text()
    assert evalb(gold, test, Parameters(max_error=4)).aborted  # 6 errors: more than 4 + 1
    assert not evalb(gold, test, Parameters(max_error=5)).aborted


def test_malformed_lines() -> None:
    report = evalb(["(S (X a b))"], ["(S (X a))"], Parameters(max_error=3))
    assert report.aborted
    assert report.messages == ["1 : More than two elements in a bracket\n"] + ["1 : Reading sentence\n"] * 4
    report = evalb(["(S (X a) (X b)"], ["(S (X a) (X b))"])
    assert report.messages == ["1 : Bracketing is unbalanced (too many open bracket)\n"]
    assert report.sentences[0].status == 1 and report.all.errors == 1
    report = evalb(["(S (X a))", "(S (X a))"], ["(S (X a))"])
    assert report.messages == ["2 : Number of lines unmatch (too many lines in gold file)\n"]
    report = evalb(["(S (X a))"], ["(S (X a))", "(S (X a))"])
    assert report.messages == ["2 : Number of lines unmatch (too many lines in test file)\n"]


def test_sentences_past_the_programs_buffers() -> None:
    long = "(S " + " ".join(f"(X w{i})" for i in range(201)) + ")"
    report = evalb([long], [long])
    assert report.sentences[0].status == 1 and "200 words" in report.messages[0]
    assert evalb([long], [long], limits=False).all.fmeasure == 100.0


def _random_tree(rng: random.Random, words: list[str], labels: str) -> str:
    if len(words) == 1 and rng.random() < 0.7:
        return f"({rng.choice('PQ,')} {words[0]})"
    cut = sorted(rng.sample(range(1, len(words)), k=min(len(words) - 1, rng.randint(1, 3)))) \
        if len(words) > 1 else []
    parts, start = [], 0
    for c in [*cut, len(words)]:
        parts.append(_random_tree(rng, words[start:c], labels))
        start = c
    label = rng.choice(labels) + rng.choice(["", "", "-SBJ", "=1"])
    return f"({label} {' '.join(parts)})"


def _crossing_brute_force(gold: list[tuple[int, int]], test: list[tuple[int, int]]) -> int:
    return sum(any(a < s < b < e or s < a < e < b for a, b in gold) for s, e in test)


def test_fast_paths_agree_with_the_programs_loops_and_brute_force() -> None:
    rng = random.Random(0)
    gold, test = [], []
    for _ in range(300):
        words = [rng.choice(["a", "b", "c", "'", '"']) for _ in range(rng.randint(1, 12))]
        gold.append(_random_tree(rng, words, "ABCT"))
        test.append(_random_tree(rng, words, "ABCTU"))
    params = Parameters(delete_labels=("T", ","), quote_labels=("P", ","), eq_labels=(("A", "U"),),
                        max_error=10**6)
    fast = evalb(gold, test, params)
    literal = evalb(gold, test, Parameters(**{**params.__dict__, "debug": 2}))
    assert [r.line() for r in fast.sentences] == [r.line() for r in literal.sentences]
    assert fast.messages == literal.messages
    assert sum(r.status == 0 for r in fast.sentences) > 30
    # crossing by brute force over the spans the program scores
    for g, t in zip(gold, test):
        plain = Parameters(max_error=10**6)
        r = evalb([g], [t], plain).sentences[0]
        spans = [_spans(g), _spans(t)]
        assert r.crossing == _crossing_brute_force(*spans)


def _spans(tree: str) -> list[tuple[int, int]]:
    out, stack, n = [], [], 0
    tokens = tree.replace("(", " ( ").replace(")", " ) ").split()
    i = 0
    while i < len(tokens):
        if tokens[i] == "(" and tokens[i + 2] not in "()":
            n += 1
            i += 4
            continue
        if tokens[i] == "(":
            stack.append(n)
            i += 2
            continue
        out.append((stack.pop(), n))
        i += 1
    return [s for s in out if s[0] != s[1]]


def test_the_report_of_an_empty_scoring_prints_minus_nan(tmp_path: Path) -> None:
    report = evalb(["(S (X a))"], ["(S (X b))"])
    assert "Bracketing FMeasure       =   -nan\n" in report.text()
