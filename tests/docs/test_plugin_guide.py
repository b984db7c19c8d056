"""The plugin author's guide works as written. Its example is one package with three
copies that cannot drift: ``seqtrans new-task mytask`` writes it (the one source, the
templates), docs/examples/seqtrans-mytask/ holds what it writes (``python docs/generate.py``),
and docs/plugins.md shows those files. The package installs, passes its own tests and
mypy, is listed by ``seqtrans tasks``, trains and scores."""

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

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from conftest import ROOT
from seqtrans.tasks.scaffold import new_task

GUIDE = ROOT / "docs" / "plugins.md"
EXAMPLE = ROOT / "docs" / "examples" / "seqtrans-mytask"
LEFTOVERS = ("__pycache__", ".*", "*.egg-info", "build", "dist")  # of running or building it in place
FILE_BLOCK = re.compile(r"<!-- file: (\S+) -->\n```\w+\n(.*?)```", re.DOTALL)
EXCERPT_BLOCK = re.compile(r"<!-- excerpt: (\S+) -->\n```\w+\n(.*?)```", re.DOTALL)
COMMAND_BLOCK = re.compile(r"<!-- command: (\S+) -->\n```python\n(.*?)```", re.DOTALL)
ENTRY_BLOCK = re.compile(r"<!-- command entry point -->\n```toml\n(.*?)```", re.DOTALL)


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


def _example() -> dict[str, bytes]:
    files = [path.relative_to(EXAMPLE) for path in EXAMPLE.rglob("*") if path.is_file()]
    return {path.as_posix(): (EXAMPLE / path).read_bytes() for path in files
            if not any(fnmatch(part, pattern) for part in path.parts for pattern in LEFTOVERS)}


def test_the_example_is_what_new_task_writes(tmp_path: Path) -> None:
    out = tmp_path / "seqtrans-mytask"
    written = {path.relative_to(out).as_posix(): path.read_bytes()
               for path in new_task("mytask", directory=out, installed=set())}
    assert set(written) == {"README.md", "pyproject.toml", "seqtrans_mytask/__init__.py",
                            "seqtrans_mytask/py.typed", "tests/test_mytask.py"}
    assert _example() == written, "docs/examples/seqtrans-mytask is out of date: python docs/generate.py"


def test_the_guide_shows_the_example_files_byte_for_byte() -> None:
    shown, example = _files(), _example()
    assert set(shown) == {"pyproject.toml"}
    for name, text in shown.items():
        assert example[name] == text.encode("utf-8"), f"docs/plugins.md and {name} differ"
    parts = EXCERPT_BLOCK.findall(GUIDE.read_text(encoding="utf-8"))
    assert {name for name, _ in parts} == {"seqtrans_mytask/__init__.py", "tests/test_mytask.py"}
    for name, text in parts:
        assert text in example[name].decode("utf-8"), f"docs/plugins.md shows what {name} does not hold"
    task = example["seqtrans_mytask/__init__.py"].decode("utf-8")
    shown_task = [text for name, text in parts if name == "seqtrans_mytask/__init__.py"]
    assert shown_task[0].startswith('"""') and task.endswith(shown_task[-1])  # its beginning and its end


def test_the_guides_command_runs_as_the_guide_says(tmp_path: Path) -> None:
    """Section 5: the command module and its entry point, installed beside the example."""
    guide = GUIDE.read_text(encoding="utf-8")
    [(module, code)] = COMMAND_BLOCK.findall(guide)
    [entry] = ENTRY_BLOCK.findall(guide)
    commands = tomllib.loads(entry)["project"]["entry-points"]["seqtrans.commands"]
    site = tmp_path / "site"
    shutil.copytree(EXAMPLE / "seqtrans_mytask", site / "seqtrans_mytask")
    (site / module).write_text(code, encoding="utf-8")
    info = site / "seqtrans_mytask-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: seqtrans-mytask\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[seqtrans.commands]\n" + "".join(
        f"{name} = {target}\n" for name, target in commands.items()))
    data = tmp_path / "pairs.tsv"
    data.write_text("abc\tcba\n\tx\n" + "ab" * 11 + "\tx\nabc\tcba\n", encoding="utf-8")
    seqtrans = [sys.executable, "-m", "seqtrans"]
    done = _run(*seqtrans, "mytask-count", str(data), site=site, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == ("examples: 2\nleft out, empty source or target: 1\n"
                           "left out, more than data.max_letters=20 letters: 1\n")
    data.write_text("abc\tcba\nabc\n", encoding="utf-8")
    done = _run(*seqtrans, "mytask-count", str(data), site=site, cwd=tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip() == (f"seqtrans mytask-count: error: {data}:2: expected source<TAB>target, "
                                   "found 1 field(s)")
    listed = _run(*seqtrans, "--help", site=site, cwd=tmp_path).stdout
    assert "mytask-count(seqtrans-mytask)" in "".join(listed.split())  # argparse wraps at hyphens


def test_the_guides_plugin_passes_its_own_test(installed: tuple[Path, Path]) -> None:
    package, site = installed
    # -p no:flake8: a test dependency (simuleval) installs a pytest plugin that current pytest rejects
    done = _run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:flake8", "tests",
                site=site, cwd=package)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 passed" in done.stdout


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

    letters = "abcdef"
    # each rotation of the letters and each prefix, to be reversed
    words = [w for i in range(len(letters)) for w in (letters[i:] + letters[:i], letters[: i + 1])]
    lines = [f"{w}\t{w[::-1]}\n" for w in words]
    for split in ("train", "dev", "test"):
        (work / f"{split}.tsv").write_text("".join(lines), encoding="utf-8")
    done = _run(sys.executable, "-m", "seqtrans", "-q", "run", "mytask", "--out", "run", "--device", "cpu",
                "--set", "model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=16",
                "model.d_ff=32", "model.heads=2", "train.max_steps=5", "train.eval_every=5",
                "train.checkpoint_every=5", "train.max_minutes=0", "data.train=train.tsv", "data.dev=dev.tsv",
                "data.test=test.tsv", site=site, cwd=work)
    assert done.returncode == 0, done.stderr
    metrics = json.loads((work / "run" / "metrics.json").read_text())
    assert metrics["test_sentences"] == 12 and metrics["skipped"] == 0 and 0 <= metrics["exact_match"] <= 100
    assert len((work / "run" / "predictions" / "test.txt").read_text().splitlines()) == 12
