"""The README, CI and docs say what the code does."""

from __future__ import annotations

import json
import re
import runpy

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
    assert {path.name for path, _ in blocks} >= {"speed.md", "streaming.md", "attention.md"}
    for (path, name), (now, wanted) in blocks.items():
        assert now is not None, f"{path}: no generated block {name!r}"
        assert now == wanted, f"{path}: block {name!r} is out of date: python docs/generate.py"
    # a value read from the JSON, formatted as the table shows it
    decode = json.loads((ROOT / "benchmarks" / "results" / "decode_speed-cpu.json").read_text())
    first = decode["rows"][0]
    row = f"| base, greedy, batch 1 | {first['seqtrans_tok_s']:.1f} | {first['hf_tok_s']:.1f} |"
    assert row in blocks[ROOT / "docs" / "speed.md", "decode_cpu"][1]


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


# --- numbers in the speed and inference pages trace to benchmarks/results/ ----------------

#: A measured number: a figure with a unit, a percentage or a ratio ("1.35x", "45 %",
#: "3,080 MiB", "14-15 ms", "151.5 tokens/s", "35.34 BLEU"). Settings ("beam 4", "alpha
#: 0.6"), counts ("6 layers", "three 4s") and shapes ("512 x 2,048") are not checked.
MEASURED = re.compile(r"(?<![\w.-])\d+(?:,\d{3})*(?:\.\d+)?(?:\s*(?:-|–|to)\s*\d+(?:\.\d+)?)?\s*"
                      r"(?:(?:x|×)(?!\s*\d)|%|MiB|GiB|MB|GB|ms|µs|(?<=\s)s|minutes|sentences/s|tokens/s|tok/s|"
                      r"BLEU|F1)(?![\w])")
NAMES_RESULTS = re.compile(r"[\w.-]+\.json")
NUMBER_PAGES = ("speed.md", "inference.md")


def unsourced_paragraphs(page: str, text: str) -> dict[tuple[str, str], list[str]]:
    """The paragraphs (blank-line separated) of ``text`` outside generated blocks and code
    that hold measured numbers but name no ``.json`` file (a table may name it in the
    paragraph just before or after it, its caption): (page, first six words) -> the numbers."""
    paragraphs: list[list[str]] = [[]]
    generated = fenced = False
    for line in text.splitlines():
        if line.startswith(("<!-- begin generated", "<!-- end generated", "```")):
            paragraphs.append([])
            generated ^= line.startswith(("<!-- begin generated", "<!-- end generated"))
            fenced ^= line.startswith("```")
        elif generated or fenced:
            continue
        elif not line.strip() or line.startswith("#"):
            paragraphs.append([])
        else:
            paragraphs[-1].append(line)
    joined = [" ".join(p) for p in paragraphs if p]
    found: dict[tuple[str, str], list[str]] = {}
    for i, paragraph in enumerate(joined):
        prose = re.sub(r"\]\([^)]*\)", "]", re.sub(r"`[^`]*`", "", paragraph))  # no code, no link targets
        numbers = MEASURED.findall(prose)
        around = joined[max(i - 1, 0): i + 2] if paragraph.startswith("|") else [paragraph]
        if numbers and not any(NAMES_RESULTS.search(p) for p in around):
            found[page, " ".join(paragraph.split()[:6])] = numbers
    return found


def test_unsourced_paragraphs_are_found() -> None:
    text = ("Fast: 1.35x the peer.\n\nFrom `benchmarks/results/x.json`: 2.0x.\n\n"
            "<!-- begin generated: t -->\n| 3.1x |\n<!-- end generated: t -->\n\n"
            "```\nrun --beam 4 # 5 ms\n```\n\nBeam 4 and alpha 0.6, `took 9 ms`.\n\n"
            "| a | 7 % |\n\nFrom `y.json`.\n\nNo source.\n\n| b | 8 ms |\n\nNone here.\n\n"
            "Rows of 512 x 2,048, three 4s, 0.5 s and 2x.\n")
    assert unsourced_paragraphs("p.md", text) == {("p.md", "Fast: 1.35x the peer."): ["1.35x"],
                                                  ("p.md", "| b | 8 ms |"): ["8 ms"],
                                                  ("p.md", "Rows of 512 x 2,048, three"): ["0.5 s", "2x"]}


def test_numbers_in_the_speed_and_inference_pages_name_their_results() -> None:
    found: dict[tuple[str, str], list[str]] = {}
    for page in NUMBER_PAGES:
        found |= unsourced_paragraphs(page, (ROOT / "docs" / page).read_text(encoding="utf-8"))
    assert not found, ("measured numbers outside a generated table, in a paragraph that names no "
                       f"benchmarks/results/*.json (DEVELOPERS.md, 'Numbers in the docs'): {found}")
