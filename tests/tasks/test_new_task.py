"""``seqtrans new-task NAME``: the package it writes is a plugin that keeps the contract as
written. Refusals are checked here at once; the slow test builds the package into a
wheel, installs it beside a wheel of seqtrans in a fresh virtual environment, and runs
the package's own tests and mypy, check_task, ``seqtrans tasks`` and ``seqtrans run``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from wheels import build_wheels, check, engine_source, environment, fresh_venv

from seqtrans.cli import main
from seqtrans.errors import UsageError
from seqtrans.tasks.scaffold import new_task


@pytest.mark.parametrize("name, problem", [
    ("9lives", "not a task name: use a Python identifier"), ("my-task", "not a task name"),
    ("class", "not a task name"), ("café", "not a task name"), ("MyTask", "a task name is lower case"),
    ("_hidden", "starts with a letter"), ("copy", "a task named 'copy' is already installed"),
])
def test_a_bad_name_is_refused_before_anything_is_written(tmp_path: Path, name: str, problem: str) -> None:
    with pytest.raises(UsageError, match=problem):
        new_task(name, directory=tmp_path / "pkg", installed={"copy"})
    assert not (tmp_path / "pkg").exists()


def test_a_directory_that_holds_files_is_refused_and_an_empty_one_taken(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="full already exists and is not an empty directory"):
        new_task("g2p", directory=tmp_path / "full", installed=set())
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["notes.txt"]
    (tmp_path / "empty").mkdir()
    written = new_task("g2p", directory=tmp_path / "empty", installed=set())
    assert sorted(str(p.relative_to(tmp_path / "empty")) for p in written) == [
        "README.md", "pyproject.toml", "seqtrans_g2p/__init__.py", "seqtrans_g2p/py.typed",
        "tests/test_g2p.py"]


def test_the_package_registers_its_task_and_names_its_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["new-task", "grapheme_to_phoneme"]) == 0
    root = tmp_path / "seqtrans-grapheme-to-phoneme"
    assert f"wrote {Path('seqtrans-grapheme-to-phoneme') / 'pyproject.toml'}" in capsys.readouterr().out
    project = (root / "pyproject.toml").read_text().splitlines()
    assert 'name = "seqtrans-grapheme-to-phoneme"' in project
    entry_points = project.index('[project.entry-points."seqtrans.tasks"]')
    target = "seqtrans_grapheme_to_phoneme:GraphemeToPhonemeTask"
    assert project[entry_points + 1] == f'grapheme_to_phoneme = "{target}"'
    assert 'dependencies = ["seqtrans>=0.2,<0.3"]' in project
    module = (root / "seqtrans_grapheme_to_phoneme" / "__init__.py").read_text()
    assert 'name = "grapheme_to_phoneme"' in module and "class GraphemeToPhonemeTask:" in module
    assert main(["new-task", "grapheme_to_phoneme"]) == 2  # the directory is there now


@pytest.mark.slow
def test_the_package_passes_its_own_checks_and_trains_from_a_wheel(tmp_path: Path) -> None:
    env = environment()
    package = tmp_path / "src" / "seqtrans-reversal"
    new_task("reversal", directory=package, installed=set())
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    built = build_wheels([engine_source(tmp_path / "src"), package], wheels, env=env)
    assert sorted(p.name.split("-")[0] for p in built) == ["seqtrans", "seqtrans_reversal"]
    bin_ = fresh_venv(tmp_path, built, env=env)
    python = bin_ / "python"
    # the test environment carries pytest-flake8, whose hooks this pytest rejects (as our own
    # pyproject says); the package's tests and settings are run as written
    check(python, "-m", "pytest", "-q", "-p", "no:flake8", "-p", "no:cacheprovider", cwd=package, env=env)
    check(python, "-m", "mypy", cwd=package, env=env)
    job = tmp_path / "job"  # no sources here: only what is installed counts
    job.mkdir()
    scores = check(python, "-c", "from pathlib import Path\n"
                   "from seqtrans.plugin import check_task\n"
                   "from seqtrans_reversal import ReversalConfig, ReversalTask\n"
                   "print(check_task(ReversalTask(ReversalConfig()), Path('vocab')))", cwd=job, env=env)
    assert scores.stdout.strip() == "{'cer': 0.0, 'exact_match': 100.0}"
    listed = check(bin_ / "seqtrans", "tasks", cwd=job, env=env).stdout.splitlines()
    assert [line.split()[:4] for line in listed[1:]] == [["reversal", "seqtrans-reversal", "0.1.0", "ok"]]
    check(bin_ / "seqtrans", "-q", "run", "reversal", "--out", "run", "--device", "cpu",
          "--set", "train.max_steps=20", "train.eval_every=10", "train.checkpoint_every=10",
          "train.max_minutes=0", cwd=job, env=env)
    metrics = json.loads((job / "run" / "metrics.json").read_text())
    assert metrics["train_steps"] == 20 and metrics["test_sentences"] == 100 and metrics["skipped"] == 0
    assert metrics["cer"] >= 0 and (job / "run" / "checkpoints" / "best.pt").is_file()
    config = json.loads((job / "run" / "config.json").read_text())
    assert config["model"]["d_model"] == 32 and config["decode"]["beam"] == 2  # the task's preset, defaults
