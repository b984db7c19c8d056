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
