"""The documentation site builds with ``mkdocs build --strict``: a broken link, a missing
anchor or a stale API reference fails the test suite, and so CI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

import seqtrans
import seqtrans.tasks
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


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path, bool]:
    """The site, built once for the tests of this module (about ten seconds, most of it
    mkdocstrings loading the packages): the build, its directory, and whether the working
    tree was left as it was."""
    before = snapshot(ROOT)
    site = tmp_path_factory.mktemp("site")
    done = build(ROOT / "mkdocs.yml", site)
    return done, site, snapshot(ROOT) == before


@pytest.fixture(scope="module")
def site(built: tuple[subprocess.CompletedProcess[str], Path, bool]) -> Path:
    done, site, _ = built
    assert done.returncode == 0, done.stderr
    return site


def test_the_site_builds_strictly_and_writes_nothing_into_the_repository(
        built: tuple[subprocess.CompletedProcess[str], Path, bool]) -> None:
    done, site, untouched = built
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    assert untouched
    # the API reference was rendered from the docstrings, not left as '::: module' text
    reference = (site / "reference" / "index.html").read_text(encoding="utf-8")
    assert 'id="seqtrans.load"' in reference
    assert ":::" not in reference
    for page in ("getting-started", "concepts", "streaming", "faq", "speed"):
        assert (site / page / "index.html").is_file(), page
    assert (site / "images" / "attention_copy.png").stat().st_size > 10_000


# --- what the pages show ---------------------------------------------------------------------

#: The elements the theme, Markdown and mkdocstrings write. Any other one is text in angle
#: brackets that Markdown passed on as HTML and a browser hides (`<TAB>`, `<unk>`), or shows
#: as something else (`<s>` strikes through what follows).
ELEMENTS = {"html", "head", "body", "meta", "link", "title", "script", "style", "header", "footer", "main",
            "nav", "article", "div", "span", "p", "a", "ul", "ol", "li", "h1", "h2", "h3", "h4", "h5", "h6",
            "table", "thead", "tbody", "tr", "th", "td", "code", "pre", "em", "strong", "small", "img", "svg",
            "path", "form", "input", "label", "button", "br", "hr", "blockquote", "details", "summary",
            "sup", "sub", "dl", "dt", "dd", "kbd", "abbr"}
#: Text in angle brackets on a page: a token (`<unk>`, `</s>`), a key (`<TAB>`), a placeholder
#: (`ct2_<type>_tok_s`). The pages write no HTML of their own, so all of it is meant literally.
ANGLED = re.compile(r"</?[A-Za-z_][\w:.-]*>")
#: A docstring's reST role (`:func:`name``) printed as it was written instead of a link.
ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj|const):(?=\S)")


class Page(HTMLParser):
    """The elements of an HTML page, and the text of its article (what the Markdown became)."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: set[str] = set()
        self.inside = False  # in the <article>, where the Markdown's HTML is
        self.parts: list[str] = []
        self.feed(html)
        self.text = "".join(self.parts)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.add(tag)
        self.inside |= tag == "article"

    def handle_endtag(self, tag: str) -> None:
        self.elements.add(tag)
        self.inside &= tag != "article"

    def handle_data(self, data: str) -> None:
        if self.inside:
            self.parts.append(data)


def html_of(site: Path, page: Path) -> Path:
    """The HTML file mkdocs writes for ``page`` (``docs/tasks/copy.md`` -> ``tasks/copy/index.html``)."""
    relative = page.relative_to(ROOT / "docs").with_suffix("")
    return site / (relative.parent if relative.name == "index" else relative) / "index.html"


def pages(site: Path) -> dict[Path, Page]:
    return {path: Page(path.read_text(encoding="utf-8")) for path in sorted(site.rglob("*.html"))}


def test_the_pages_hold_only_the_elements_that_were_meant(site: Path) -> None:
    strays = {str(path.relative_to(site)): sorted(page.elements - ELEMENTS)
              for path, page in pages(site).items() if page.elements - ELEMENTS}
    assert not strays, ("text in angle brackets rendered as HTML (write it in `code`, or as &lt;...&gt;): "
                        f"{strays}")


def test_text_in_angle_brackets_is_shown_as_text(site: Path) -> None:
    lost = {}
    for source in sorted((ROOT / "docs").rglob("*.md")):
        if source.is_relative_to(ROOT / "docs" / "examples"):
            continue  # files of an example, not pages (mkdocs.yml's exclude_docs)
        markdown = re.sub(r"<!--.*?-->", "", source.read_text(encoding="utf-8"), flags=re.DOTALL)
        wanted = Counter(ANGLED.findall(markdown))
        text = Page(html_of(site, source).read_text(encoding="utf-8")).text
        missing = {literal: n - text.count(literal) for literal, n in wanted.items()
                   if text.count(literal) < n}
        if missing:
            lost[str(source.relative_to(ROOT))] = missing
    assert not lost, f"text in angle brackets missing from the rendered pages (times): {lost}"
    assert "SOURCE<TAB>PREFIX" in Page((site / "cli" / "index.html").read_text(encoding="utf-8")).text


def test_docstring_roles_are_rendered_as_references(site: Path) -> None:
    literal = {str(path.relative_to(site)): sorted(set(ROLE.findall(page.text)))
               for path, page in pages(site).items() if ROLE.search(page.text)}
    assert not literal, f"docstring roles printed as text: {literal}"
    reference = (site / "reference" / "index.html").read_text(encoding="utf-8")
    # Loaded's docstring names :meth:`predict`: a link to the method, under its public name
    assert re.search(r'<a class="autorefs autorefs-internal"[^>]* href="#seqtrans\.Loaded\.predict"',
                     reference)


def test_the_api_reference_documents_the_names_a_user_imports(site: Path) -> None:
    reference = {path.parent.name: path.read_text(encoding="utf-8")
                 for path in (site / "reference").rglob("index.html")}
    assert all(len(html) < 300_000 for html in reference.values()), {k: len(v) for k, v in reference.items()}
    everything = "".join(reference.values())
    for name in sorted(set(seqtrans.__all__) - {"__version__", "tasks"}):
        assert f'id="seqtrans.{name}"' in everything or f'id="seqtrans.tasks.{name}"' in everything, name
    for name in seqtrans.tasks.__all__:
        assert f'id="seqtrans.tasks.{name}"' in reference["tasks"], name
    # no engine-internal path where a public name documents the object
    assert 'id="seqtrans.inference.loading.load"' not in everything


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
    handler["options"]["extensions"] = [str(ROOT / e) for e in handler["options"]["extensions"]]
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert complaint in done.stderr, done.stderr
