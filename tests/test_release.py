"""The release's version is stated once per place and agrees: pyproject.toml,
``seqtrans.__version__``, an entry of CHANGELOG.md, the plugins' dependency ranges and
the contract's version in the plugin guide and reference."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import seqtrans

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _project(path: Path) -> dict[str, Any]:
    return dict(tomllib.loads(path.read_text(encoding="utf-8"))["project"])


def test_the_version_is_the_same_in_pyproject_and_the_package() -> None:
    assert _project(ROOT / "pyproject.toml")["version"] == seqtrans.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", seqtrans.__version__)  # semantic versioning


def test_the_changelog_has_an_entry_for_the_current_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \[(\d+\.\d+\.\d+)\]", changelog, re.MULTILINE)
    assert headings and headings[0] == seqtrans.__version__  # the newest entry first
    entry = changelog.split(f"## [{seqtrans.__version__}]", 1)[1].split("\n## [", 1)[0]
    assert "\n- " in entry  # it says what changed


def test_the_plugins_and_the_guide_name_the_current_minor_series() -> None:
    major, minor = (int(part) for part in seqtrans.__version__.split(".")[:2])
    series = f"seqtrans>={major}.{minor},<{major}.{minor + 1}"
    for pyproject in sorted((ROOT / "plugins").glob("*/pyproject.toml")):
        requires = [str(d) for d in _project(pyproject)["dependencies"]]
        assert series in requires, pyproject
    for page in ("plugins.md", "plugin-contract.md"):  # the guide and the reference
        text = (ROOT / "docs" / page).read_text(encoding="utf-8")
        assert f"the contract of seqtrans {major}.{minor}" in text and series in text, page
