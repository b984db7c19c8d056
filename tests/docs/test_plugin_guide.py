"""The plugin author's guide works as written: its files, shown in docs/plugins.md and
kept as the finished example in docs/examples/seqtrans-mytask/, make a distribution that
installs, passes its own tests and mypy, is listed by ``seqtrans tasks``, trains and
scores."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from fnmatch import fnmatch
from pathlib import Path

import pytest

from conftest import ROOT

GUIDE = ROOT / "docs" / "plugins.md"
EXAMPLE = ROOT / "docs" / "examples" / "seqtrans-mytask"
LEFTOVERS = ("__pycache__", ".*", "*.egg-info", "build", "dist")  # of running or building it in place
FILE_BLOCK = re.compile(r"<!-- file: (\S+) -->\n```\w+\n(.*?)```", re.DOTALL)


def _files() -> dict[str, str]:
    return dict(FILE_BLOCK.findall(GUIDE.read_text(encoding="utf-8")))


def _run(*args: str, site: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "MYPYPATH": str(ROOT)}  # mypy does not follow the editable install of seqtrans
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The example package, copied out (a build writes beside its sources) and
    pip-installed into a folder of its own."""
    work = tmp_path_factory.mktemp("guide")
    package, site = work / "seqtrans-mytask", work / "site"
    shutil.copytree(EXAMPLE, package, ignore=shutil.ignore_patterns(*LEFTOVERS))
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                           "--no-build-isolation", "--target", str(site), str(package)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return package, site


def test_the_guide_shows_the_example_files_byte_for_byte() -> None:
    shown = _files()
    assert set(shown) == {"pyproject.toml", "seqtrans_mytask/__init__.py", "tests/test_mytask.py"}
    for name, text in shown.items():
        assert (EXAMPLE / name).read_bytes() == text.encode("utf-8"), f"docs/plugins.md and {name} differ"
    files = [path.relative_to(EXAMPLE) for path in EXAMPLE.rglob("*") if path.is_file()]
    kept = {path.as_posix() for path in files
            if not any(fnmatch(part, pattern) for part in path.parts for pattern in LEFTOVERS)}
    assert kept == {*shown, "README.md"}


def test_the_guides_plugin_passes_its_own_test(installed: tuple[Path, Path]) -> None:
    package, site = installed
    # -p no:flake8: a test dependency (simuleval) installs a pytest plugin that current pytest rejects
    done = _run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:flake8", "tests",
                site=site, cwd=package)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


def test_mypy_checks_the_guides_plugin_against_the_contract(installed: tuple[Path, Path]) -> None:
    package, site = installed
    module = package / "seqtrans_mytask" / "__init__.py"
    mypy = [sys.executable, "-m", "mypy", "--ignore-missing-imports", "--no-error-summary",
            "--cache-dir", str(ROOT / ".mypy_cache")]
    done = _run(*mypy, str(module), site=site, cwd=package)
    assert done.returncode == 0, done.stdout + done.stderr
    # the same plugin with a prediction type its format() does not take is caught
    wrong = package.parent / "wrong" / "seqtrans_mytask.py"
    wrong.parent.mkdir(exist_ok=True)
    right = "def format(self, prediction: str) -> str:\n        return prediction"
    assert right in module.read_text()
    wrong.write_text(module.read_text().replace(right, right.replace(": str)", ": int)").replace(
        "return prediction", "return str(prediction)")))
    done = _run(*mypy, str(wrong), site=site, cwd=package)
    lines = wrong.read_text().splitlines()
    line = 1 + next(i for i, text in enumerate(lines) if text.startswith("_contract"))
    assert done.returncode == 1 and f"seqtrans_mytask.py:{line}: error:" in done.stdout, done.stdout


def test_the_guides_plugin_is_listed_trains_and_scores(installed: tuple[Path, Path]) -> None:
    package, site = installed
    work = package.parent  # not the source folder: its build metadata would be found too
    listed = _run(sys.executable, "-m", "seqtrans", "tasks", site=site, cwd=work)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith("mytask "))
    name, distribution, version, status = row.split()
    assert (distribution.replace("_", "-"), version, status) == ("seqtrans-mytask", "0.1.0", "ok")

    words = "a b c d e f".split()
    # each rotation of the words and each prefix, to be reversed
    sequences = [s for i in range(len(words)) for s in (words[i:] + words[:i], words[: i + 1])]
    lines = [f"{' '.join(s)}\t{' '.join(reversed(s))}\n" for s in sequences]
    for split in ("train", "dev", "test"):
        (work / f"{split}.tsv").write_text("".join(lines), encoding="utf-8")
    done = _run(sys.executable, "-m", "seqtrans", "-q", "run", "mytask", "--out", "run", "--device", "cpu",
                "--set", "model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=16",
                "model.d_ff=32", "model.heads=2", "train.max_steps=5", "train.eval_every=5",
                "train.checkpoint_every=5", "train.max_minutes=0", site=site, cwd=work)
    assert done.returncode == 0, done.stderr
    metrics = json.loads((work / "run" / "metrics.json").read_text())
    assert metrics["test_sentences"] == 12 and metrics["skipped"] == 0 and 0 <= metrics["exact_match"] <= 1
    assert len((work / "run" / "predictions" / "test.txt").read_text().splitlines()) == 12
