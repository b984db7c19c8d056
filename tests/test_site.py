"""The documentation site builds with ``mkdocs build --strict``: a broken link, a missing
anchor or a stale API reference fails the test suite, and so CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import ROOT


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # the theme's banner about its successor
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], cwd=config.parent, capture_output=True, text=True,
                          env=env, timeout=120)


def snapshot(root: Path) -> dict[str, int]:
    """Every file of the working tree but hidden and cache directories, with its mtime."""
    out = {}
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
        for name in files:
            path = Path(directory, name)
            out[str(path.relative_to(root))] = path.lstat().st_mtime_ns
    return out


def test_the_site_builds_strictly_and_writes_nothing_into_the_repository(tmp_path: Path) -> None:
    before = snapshot(ROOT)
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    assert snapshot(ROOT) == before
    site = tmp_path / "site"
    # the API reference was rendered from the docstrings, not left as '::: module' text
    reference = (site / "reference" / "index.html").read_text(encoding="utf-8")
    assert 'id="seqtrans.streaming.decoder.stream_greedy"' in reference
    assert ":::" not in reference
    for page in ("getting-started", "concepts", "streaming", "faq", "speed"):
        assert (site / page / "index.html").is_file(), page
    assert (site / "images" / "attention_copy.png").stat().st_size > 10_000


@pytest.mark.parametrize("text, complaint", [
    ("See [the missing page](missing.md).", "missing.md"),
    ("See [speed](speed.md#no-such-section).", "no-such-section"),
    ("::: seqtrans.no_such_module", "seqtrans.no_such_module"),
])
def test_a_broken_link_or_a_stale_reference_fails_the_build(tmp_path: Path, text: str,
                                                             complaint: str) -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(f"# Broken\n\n{text}\n", encoding="utf-8")
    (docs / "speed.md").write_text("# Speed\n\n## Method\n", encoding="utf-8")
    config["nav"] = [{"Home": "index.md"}, {"Speed": "speed.md"}]
    handler = config["plugins"][1]["mkdocstrings"]["handlers"]["python"]
    handler["paths"] = [str(ROOT / p) for p in handler["paths"]]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert complaint in done.stderr, done.stderr
