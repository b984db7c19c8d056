"""The README, CI and docs say what the code does."""

from __future__ import annotations

import bisect
import functools
import json
import re
import runpy
from pathlib import Path
from typing import Any

import pytest
from test_inference import copy_run

from conftest import ROOT
from seqtrans.cli import COMMANDS
from seqtrans.config import RunConfig, markdown_table


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = ci.strip().splitlines()[-1]
    assert command.startswith("pip install -r requirements-dev.txt")
    assert f"\n{command}\n" in readme
    assert "\npip install ./ ./plugins/copy && seqtrans run copy\n" in readme


def test_the_configuration_reference_is_generated_from_the_code() -> None:
    generate = runpy.run_path(str(ROOT / "docs" / "generate.py"))
    pages = generate["tables"]()
    assert len(pages) >= 2
    for path, table in pages.items():
        assert path.read_text().endswith("-->\n" + table), f"{path} is out of date: python docs/generate.py"
    assert markdown_table(RunConfig()) in pages[ROOT / "docs" / "configuration.md"]


def test_the_tables_of_measurements_are_generated_from_the_benchmark_results() -> None:
    generate = runpy.run_path(str(ROOT / "docs" / "generate.py"))
    blocks = generate["blocks"]()
    assert {path.name for path, _ in blocks} >= {"speed.md", "streaming-multi30k.md", "attention-results.md"}
    for (path, name), (now, wanted) in blocks.items():
        assert now is not None, f"{path}: no generated block {name!r}"
        assert now == wanted, f"{path}: block {name!r} is out of date: python docs/generate.py"
    # a value read from the JSON, formatted as the table shows it
    decode = json.loads((ROOT / "benchmarks" / "results" / "decode_speed-ct2-cpu.json").read_text())
    first = decode["rows"][0]
    row = f"| base, greedy, batch 1 | {first['seqtrans_tok_s']:.1f} | {first['ct2_float32_tok_s']:.1f} |"
    assert row in blocks[ROOT / "docs" / "speed.md", "decode_ct2_cpu"][1]


def test_the_results_pages_are_generated_from_every_results_file() -> None:
    generate = runpy.run_path(str(ROOT / "docs" / "results_pages.py"))
    pages = generate["pages"]()
    assert set(pages) == set((ROOT / "docs" / "results").glob("*.md")), "python docs/generate.py"
    for path, text in pages.items():
        assert path.read_text(encoding="utf-8") == text, f"{path} is out of date: python docs/generate.py"
    mkdocs = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    names = sorted(path.stem for path in pages if path.stem != "index")
    assert generate["nav"](mkdocs, names) == mkdocs, "mkdocs.yml's Results: python docs/generate.py"
    every = "".join(pages.values())
    for results in RESULTS.glob("*.json"):
        assert f"## `{results.name}` {{#{results.stem}}}" in every, results.name
    # a value read from a file, as its page prints it, beside the command that made it
    decode = json.loads((RESULTS / "decode_speed-cpu.json").read_text())
    text = pages[ROOT / "docs" / "results" / "decode_speed.md"]
    first = decode["rows"][0]
    assert f"| 1 | {first['case']} |" in text and f"| {first['seqtrans_tok_s']:.2f} |" in text
    assert f"`{decode['provenance']['command']}`" in text


def test_the_results_pages_print_values_and_records() -> None:
    generate = runpy.run_path(str(ROOT / "docs" / "results_pages.py"))
    number, tables = generate["number"], generate["tables"]
    assert [number(v) for v in (1304.31, 0.82345, 12, True, None, 2.5e-5)] == [
        "1,304.3", "0.8235", "12", "yes", "-", "2.500e-05"]
    assert number(list(range(20))) == "20 values, 0 … 19"
    out = tables({"steps": 3, "note": "a | b", "rows": [{"case": "a", "tok_s": 70.06}],
                  "by": {"x": {"f1": 1.0}, "y": {"f1": 2.0}}, "provenance": {"commit": "abc"}}, "f.json")
    assert out == ["|  | value |\n|---|---|\n| steps | 3 |\n| note | a \\| b |\n",
                   "**rows**\n\n| # | case | tok_s |\n|---|---|---|\n| 1 | a | 70.06 |\n",
                   "**by**\n\n| by | f1 |\n|---|---|\n| x | 1.000 |\n| y | 2.000 |\n"]
    known = {"decode_speed": "", "decode_speed_x": ""}
    assert generate["benchmark_of"]("decode_speed_x-cpu.json", {}, known) == "decode_speed_x"
    ran = {"provenance": {"command": "python -m benchmarks decode_speed --label x"}}
    assert generate["benchmark_of"]("other-cpu.json", ran, known) == "decode_speed"


def test_every_page_in_the_docs_navigation_exists() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = re.findall(r":\s*([\w/]+\.md)", nav)
    assert pages
    for page in pages:
        assert (ROOT / "docs" / page).is_file(), page


def test_the_readme_lists_every_command() -> None:
    readme = (ROOT / "README.md").read_text()
    for command in COMMANDS:
        assert f"`seqtrans {command}" in readme, command


# --- numbers in the docs trace to benchmarks/results/ ----------------------------------------

#: A measured number: a figure with a unit, a percentage or a ratio ("1.35x", "45 %",
#: "3,080 MiB", "14-15 ms", "151.5 tokens/s", "35.34 BLEU", "71.62 test F1"). Settings
#: ("beam 4", "alpha 0.6"), counts ("6 layers", "three 4s") and shapes ("512 x 2,048") are
#: not checked.
NUMBER = r"\d+(?:,\d{3})*(?:\.\d+)?"
MEASURED = re.compile(rf"(?<![\w.-]){NUMBER}(?:\s*(?:-|–|to)\s*\d+(?:\.\d+)?)?\s*"
                      r"(?:(?:x|×)(?!\s*\d)|%|MiB|GiB|MB|GB|ms|µs|(?<=\s)s|minutes|sentences/s|tokens/s|tok/s|"
                      r"(?:(?:greedy\s+)?(?:dev|test)\s+)?(?:BLEU|chrF|F1))(?![\w])")
#: The metrics whose names the docs write before a score ("test2016 BLEU 34.5", "AL 7.99
#: of 10.7", "test F1 32.86 to 33.05", "p95 12.5"), the names matched as written.
METRICS = (r"BLEU|chrF|F1|AL|LAAL|DAL|AP|p50|p95|p99|exact match|complete match|"
           r"token accuracy|tag accuracy|accuracy")
#: A measured number written after its metric: a decimal right after the metric's name
#: (or after "of", "is", "was", "from", "=" or ":"). An integer after a name is a count or
#: a setting and not checked; a version ("sacreBLEU 2.6.0") is not a decimal.
METRIC_FIRST = re.compile(rf"(?<![\w-])(?:{METRICS})\s*(?:(?:of|is|was|from)\s+|[=:]\s*)?"
                          r"\d+\.\d+(?![\w.])")
#: A hand-written table's header that names a measured quantity: a metric, a unit of
#: time, memory or throughput, a ratio, a speed-up or a loss. In such a table a cell that
#: begins with a decimal ("34.5", "**77.99**, 78.20", "12.2 (diverged)") is a measured
#: number, except in the first column, which names the rows ("dropout 0.1").
MEASURED_HEADER = re.compile(rf"(?<![\w-])(?:{METRICS}|ms|µs|seconds|minutes|MiB|GiB|MB|GB|"
                             r"tokens/s|tok/s|sentences/s|sent/s|ratio|speed-?up|slowdown|"
                             r"loss|perplexity|latency)(?![\w-])|%|×|\(s\)")
DECIMAL_CELL = re.compile(r"^\**\d+(?:,\d{3})*\.\d+")
TABLE_RULE = re.compile(r"^\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?$")
#: Not measurements either: a bound ("at most 2 GB", "at least 40 BLEU": a target or a
#: limit), a default ("default 30 s", "the default of 5 ms") and a training budget
#: ("30 minutes of training", "trained for 9 minutes").
SETTING = re.compile(rf"\bat\s+(?:most|least)\s+{NUMBER}|\bdefault\s+(?:of\s+)?{NUMBER}"
                     rf"|\b{NUMBER}\s+minutes\s+of\s+training\b|\btrained\s+for\s+{NUMBER}\s+minutes\b")
NAMES_JSON = re.compile(r"[\w.*-]+\.json")
RESULTS = ROOT / "benchmarks" / "results"
#: Files of a run directory: a paragraph may name them beside the results file it quotes,
#: but they are no source (they are not kept).
RUN_FILES = {"metrics.json", "config.json", "train.json"}
#: The pages held to the rule: every docs page, the README and the plugins' READMEs.
NUMBER_PAGES = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md",
                       *(ROOT / "plugins").glob("*/README.md")])


def named_results(paragraph: str) -> tuple[set[str], set[str]]:
    """The ``.json`` files a paragraph names (``*`` allowed): those found under
    ``benchmarks/results/`` and those not (a run's ``metrics.json`` or a mistake)."""
    found, missing = set(), set()
    for name in NAMES_JSON.findall(paragraph):
        base = name.rsplit("/", 1)[-1]
        (found if any(RESULTS.glob(base)) else missing).add(base)
    return found, missing


def paragraphs(text: str) -> list[str]:
    """The blank-line separated paragraphs of a markdown ``text``, their lines joined by
    newlines, without generated blocks, fenced code and headings."""
    out: list[list[str]] = [[]]
    generated = fenced = False
    for line in text.splitlines():
        if line.startswith(("<!-- begin generated", "<!-- end generated", "```")):
            out.append([])
            generated ^= line.startswith(("<!-- begin generated", "<!-- end generated"))
            fenced ^= line.startswith("```")
        elif generated or fenced:
            continue
        elif not line.strip() or line.startswith("#"):
            out.append([])
        else:
            out[-1].append(line)
    return ["\n".join(p) for p in out if p]


def table_numbers(paragraph: str) -> list[str]:
    """The measured numbers of a hand-written markdown table: when its header names a
    measured quantity, the decimal cells of its rows but for the first column's."""
    lines = [re.sub(r"`[^`]*`", "", line) for line in paragraph.splitlines()]
    if len(lines) < 3 or not lines[0].startswith("|") or not TABLE_RULE.match(lines[1].strip()):
        return []
    if not MEASURED_HEADER.search(lines[0]):
        return []
    cells = [cell.strip() for row in lines[2:] for cell in row.strip().strip("|").split("|")[1:]]
    return [cell for cell in cells if DECIMAL_CELL.match(cell)]


def unsourced_paragraphs(page: str, text: str) -> dict[tuple[str, str], list[str]]:
    """The paragraphs of ``text`` outside generated blocks and code that hold measured
    numbers but name no ``.json`` file of ``benchmarks/results/`` (a table may name it in
    the paragraph just before or after it, its caption), or name one that is not there:
    (page, first six words) -> the numbers, and each missing file as ``"missing NAME"``.
    A measured number is one of :data:`MEASURED`, :data:`METRIC_FIRST` or a decimal cell of a
    table whose header names a measured quantity (:func:`table_numbers`)."""
    joined = paragraphs(text)
    found: dict[tuple[str, str], list[str]] = {}
    for i, paragraph in enumerate(joined):
        line = " ".join(paragraph.splitlines())
        prose = re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "", line))  # no code, no link targets
        prose = SETTING.sub("", prose)
        numbers = MEASURED.findall(prose) + METRIC_FIRST.findall(prose) + table_numbers(paragraph)
        if not numbers:
            continue
        around = joined[max(i - 1, 0): i + 2] if paragraph.startswith("|") else [paragraph]
        named = [named_results(p) for p in around]
        sources = set().union(*(there for there, _ in named))
        missing = set().union(*(absent for _, absent in named)) - RUN_FILES
        if not sources or missing:
            found[page, " ".join(paragraph.split()[:6])] = numbers + [f"missing {m}" for m in sorted(missing)]
    return found


def test_unsourced_paragraphs_are_found() -> None:
    text = ("Fast: 1.35x the peer.\n\nFrom `benchmarks/results/decode_speed-cpu.json`: 2.0x.\n\n"
            "<!-- begin generated: t -->\n| 3.1x |\n<!-- end generated: t -->\n\n"
            "```\nrun --beam 4 # 5 ms\n```\n\nBeam 4 and alpha 0.6, `took 9 ms`.\n\n"
            "| a | 7 % |\n\nFrom `decode_speed-seam-*-cpu.json`.\n\n"
            "No source.\n\n| b | 8 ms |\n\nNone here.\n\n"
            "Rows of 512 x 2,048, three 4s, 0.5 s and 2x.\n\n"
            "A target of at least 40 BLEU, at most 2 GB, 30 minutes of training; trained for 9 minutes;\n"
            "a limit (default 30 s), at the default of 5 ms.\n\n"
            "Unsourced: 20 minutes of decoding, about 39 BLEU.\n\n"
            "From `benchmarks/results/no_such_run.json`: 4 ms.\n\n"
            "From `serve_load.json` and a run's `metrics.json`: 5 ms.\n\n"
            "From a run's `metrics.json` alone: 6 ms.\n\n"
            "Metric first: test2016 BLEU 34.5, AL 7.99 of 10.7, test F1 from 32.86 to 33.05.\n\n"
            "After a split: 71.62 test F1 and 47.8 greedy dev F1.\n\n"
            "Settings: beam 4, alpha 0.6, d_model 256, λ = 0.1, dropout 0.1, AL 3 words,\n"
            "F1 at 500 updates, sacreBLEU 2.6.0, exact match on every sequence.\n\n"
            "| run, dropout 0.1 | updates | dev F1 | test BLEU |\n|---|---:|---:|---:|\n"
            "| a, dropout 0.1 | 886 | **55.2**, 55.9 | 12.2 (diverged) |\n\n"
            "| key | alpha | beam |\n|---|---|---|\n| decode | 0.6 | 4 |\n\n"
            "| run | chrF |\n|---|---|\n| a | 58.5 |\n\n"
            "From `translation_multi30k.json`.\n")
    assert unsourced_paragraphs("p.md", text) == {
        ("p.md", "Fast: 1.35x the peer."): ["1.35x"],
        ("p.md", "| b | 8 ms |"): ["8 ms"],
        ("p.md", "Rows of 512 x 2,048, three"): ["0.5 s", "2x"],
        ("p.md", "Unsourced: 20 minutes of decoding, about"): ["20 minutes", "39 BLEU"],
        ("p.md", "From `benchmarks/results/no_such_run.json`: 4 ms."): ["4 ms", "missing no_such_run.json"],
        ("p.md", "From a run's `metrics.json` alone: 6"): ["6 ms"],
        ("p.md", "Metric first: test2016 BLEU 34.5, AL"): ["BLEU 34.5", "AL 7.99", "F1 from 32.86"],
        ("p.md", "After a split: 71.62 test F1"): ["71.62 test F1", "47.8 greedy dev F1"],
        ("p.md", "| run, dropout 0.1 | updates"): ["**55.2**, 55.9", "12.2 (diverged)"]}


def test_numbers_in_the_docs_name_their_results() -> None:
    found: dict[tuple[str, str], list[str]] = {}
    for page in NUMBER_PAGES:
        found |= unsourced_paragraphs(str(page.relative_to(ROOT)), page.read_text(encoding="utf-8"))
    assert not found, ("measured numbers outside a generated table, in a paragraph that names no "
                       f"benchmarks/results/*.json (DEVELOPERS.md, 'Numbers in the docs'): {found}")


# --- the Python examples of the decoding pages run -------------------------------------------

PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```$", re.MULTILINE | re.DOTALL)
#: The decoding guide and its page on lexical constraints.
DECODING_PAGES = ("inference.md", "constraints.md")


def test_every_python_example_on_the_decoding_pages_runs(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = [(name, code) for name in DECODING_PAGES
              for code in PYTHON_BLOCK.findall((ROOT / "docs" / name).read_text())]
    assert len(blocks) >= 6 and {name for name, _ in blocks} == set(DECODING_PAGES)
    for name in ("a", "b", "copy-demo"):
        copy_run(tmp_path / "runs" / name, seed=len(name))  # untrained: the calls are checked, not outputs
    monkeypatch.chdir(tmp_path)
    for number, (name, code) in enumerate(blocks, 1):
        exec(compile(code, f"docs/{name}, Python example {number}", "exec"), {})


# --- the numbers are the ones their results hold ---------------------------------------------

#: A number as the docs print it (a decimal point, thousands commas).
DECIMAL = re.compile(r"(?<![\w.,·^-])\d+(?:,\d{3})*\.\d+(?![\w.])")
#: A decimal that is not from a file: a ratio or a percentage (computed from two values of
#: a run, or of two runs, and rounded as the text needs), or a setting written before its
#: value ("dropout 0.1", "α 0.5", "τ = 0.65", "× 0.7", "noise 2").
NOT_FROM_A_FILE = re.compile(rf"{DECIMAL.pattern}(?:\s*(?:-|–|to)\s*{DECIMAL.pattern})?\s*(?:x|×|%)(?!\w)"
                             r"|(?:dropout|alpha|α|λ|τ|β|ε|lambda|noise|temperature|smoothing|lr|rate|"
                             r"top-?p|threshold|scale|×|=|≥|≤|<|>)\s*" + DECIMAL.pattern)
#: The units a file may hold a printed value in: as printed, as a fraction of a percentage,
#: in seconds for milliseconds or microseconds (and back), in bytes or MiB for MiB or GB,
#: in seconds for minutes.
SCALES = (1, 100, 1e3, 1e-3, 1e6, 1e-6, 1e9, 1e-9, 1 / 1024, 1 / 1024**2, 1 / 1024**3, 1 / 60, 60)
#: The end of a sentence: a full stop, a semicolon or a colon before a capital, a bracket or code.
SENTENCE = re.compile(r"(?<=[.;:])\s+(?=[A-Z(`])")
#: Numbers the rule does not hold yet: page -> the first six words of the paragraph -> the
#: numbers. Each is a difference or sum of values of two objects or two files, a number
#: quoted from a paper beside a run it is compared with, a number of a run whose file the
#: paragraph does not name, or a wrong one: trace it, then fix it or its source and remove
#: it from here. The test fails on an entry that is held now, so the list only shrinks.
UNTRACED: dict[str, dict[str, list[str]]] = json.loads((ROOT / "tests" / "untraced_numbers.json").read_text())


def held(value: Any, out: list[float]) -> list[float]:
    """Every number a results JSON holds, in its values and in its strings (a note that
    quotes a score), and the difference of every two numbers of one kind side by side in an
    object, their keys ending in the same word (``hard_bleu`` and ``expected_bleu``: the gap
    between two scores of a run, computed before rounding)."""
    if isinstance(value, bool):
        return out
    if isinstance(value, (int, float)):
        out.append(float(value))
    elif isinstance(value, str):
        out += [float(n.replace(",", "")) for n in re.findall(r"\d+(?:,\d{3})*(?:\.\d+)?", value)]
    elif isinstance(value, list):
        for item in value:
            held(item, out)
    elif isinstance(value, dict):
        kinds: dict[str, list[float]] = {}
        for key, item in value.items():
            if isinstance(item, (int, float)) and not isinstance(item, bool):
                kinds.setdefault(str(key).rsplit("_", 1)[-1], []).append(float(item))
        out += [abs(a - b) for same in kinds.values() for i, a in enumerate(same) for b in same[i + 1:]]
        for item in value.values():
            held(item, out)
    return out


@functools.cache
def held_by(name: str) -> tuple[float, ...]:
    """The numbers of the results files ``name`` stands for (``*`` allowed), sorted."""
    out: list[float] = []
    for path in sorted(RESULTS.glob(name)):
        held(json.loads(path.read_text(encoding="utf-8")), out)
    return tuple(sorted(out))


def holds(values: tuple[float, ...], printed: str) -> bool:
    """Whether some value, in some unit of :data:`SCALES`, rounds to ``printed``."""
    number = float(printed.replace(",", ""))
    half = 0.5 * 10 ** -len(printed.partition(".")[2]) + 1e-9
    for scale in SCALES:
        i = bisect.bisect_left(values, (number - half) / scale)  # the first that could round to it
        if i < len(values) and abs(values[i] * scale - number) <= half:
            return True
    return False


def numbers_not_held(text: str) -> list[tuple[str, str]]:
    """The decimals of the paragraphs of ``text`` that name results files (a table: in its
    caption too) that none of those files holds to the printed digits, as (the first six
    words of the paragraph, the number as printed). A sentence that names files of its own
    is held to those. The decimals in the prose and the table cells count, but for code,
    link targets, bounds and defaults (:data:`SETTING`) and :data:`NOT_FROM_A_FILE`."""
    joined = paragraphs(text)
    found = []
    for i, paragraph in enumerate(joined):
        around = joined[max(i - 1, 0): i + 2] if paragraph.startswith("|") else [paragraph]
        names = set().union(*(named_results(p)[0] for p in around))
        if not names:
            continue
        opening = " ".join(paragraph.split()[:6])
        prose = re.sub(r"\]\([^)]*\)", "]", re.sub(r"`([^`]*)`", code, paragraph))  # no link targets
        prose = NOT_FROM_A_FILE.sub("", SETTING.sub("", prose))
        # a sentence that names its own files is held to those
        for sentence in [prose] if paragraph.startswith("|") else SENTENCE.split(prose):
            own = named_results(sentence)[0]
            values = tuple(sorted(v for name in own or names for v in held_by(name)))
            found += [(opening, n) for n in DECIMAL.findall(re.sub(r"`[^`]*`", "", sentence))
                      if not holds(values, n)]
    return found


def code(span: re.Match[str]) -> str:
    """A code span kept for the names of files in it, its numbers out of reach of :data:`DECIMAL`."""
    return "`" + re.sub(r"\d", "0", span[1]) + "`" if ".json" not in span[1] else span[0]


def test_numbers_not_held_are_found() -> None:
    ceiling = json.loads((RESULTS / "serve_load.json").read_text())["batch_ceiling_sentences_per_s"]
    assert f"{ceiling:.2f}" == "54.77"
    text = ("From `serve_load.json`: 54.8 and 54.77 sentences/s, not 24.6 or 54.79;\n"
            "`--timeout-s 2.5`, dropout 0.1, τ = 0.65, 1.35x and 12.5 % are not checked.\n\n"
            "No file named: 24.6.\n\n"
            "| run | sentences/s |\n|---|---:|\n| a | 54.76 |\n\nFrom `serve_load.json`.\n")
    opening = "From `serve_load.json`: 54.8 and 54.77 sentences/s,"
    table = "| run | sentences/s | |---|---:|"
    assert numbers_not_held(text) == [(opening, "24.6"), (opening, "54.79"), (table, "54.76")]
    # the gap between two scores side by side, computed before rounding; not of two kinds
    values = tuple(sorted(held({"hard_bleu": 3.004, "expected_bleu": 1.25, "al": 2.0}, [])))
    assert holds(values, "1.75") and not holds(values, "1.76") and not holds(values, "0.75")


def test_every_number_of_a_paragraph_is_the_one_its_results_hold() -> None:
    wrong, traced = {}, {}
    for page in NUMBER_PAGES:
        name = str(page.relative_to(ROOT))
        found = numbers_not_held(page.read_text(encoding="utf-8"))
        known = {(opening, n) for opening, numbers in UNTRACED.get(name, {}).items() for n in numbers}
        if new := [f"{n} ({opening} ...)" for opening, n in found if (opening, n) not in known]:
            wrong[name] = new
        if done := sorted(known - set(found)):
            traced[name] = done
    assert not wrong, ("a number that the results files its paragraph names do not hold, to its printed "
                       f"digits (DEVELOPERS.md, 'Numbers in the docs'): {wrong}")
    assert not traced, ("numbers held by their files now, or paragraphs reworded: update "
                        f"tests/untraced_numbers.json: {traced}")
