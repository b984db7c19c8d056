"""A third-party plugin as a user gets it: the guide's example (docs/examples/seqtrans-mytask)
and seqtrans itself built into wheels, installed into a fresh virtual environment with
nothing else of this project in it, listed by ``seqtrans tasks``, trained and scored by
``seqtrans run``; beside them a plugin whose import fails is reported by name while
the others keep working."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from wheels import LEFTOVERS, build_wheels, check, engine_source, environment, fresh_venv

from conftest import ROOT

EXAMPLE = ROOT / "docs" / "examples" / "seqtrans-mytask"
BROKEN_MODULE = ROOT / "tests" / "fake_plugins" / "broken_task.py"
pytestmark = pytest.mark.slow

BROKEN_PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "seqtrans-broken"
version = "0.3.0"
dependencies = ["seqtrans"]

[project.entry-points."seqtrans.tasks"]
broken = "broken_task:Nope"

[tool.setuptools]
py-modules = ["broken_task"]
"""


def _sources(work: Path) -> list[Path]:
    """Copies of the three projects to build (a build writes beside its sources)."""
    example, broken = work / "seqtrans-mytask", work / "seqtrans-broken"
    shutil.copytree(EXAMPLE, example, ignore=LEFTOVERS)
    broken.mkdir()
    (broken / "pyproject.toml").write_text(BROKEN_PYPROJECT)
    shutil.copy(BROKEN_MODULE, broken / "broken_task.py")
    return [engine_source(work), example, broken]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """A new virtual environment holding the wheels of seqtrans, the example and the
    broken plugin, and the test environment's third-party packages through a .pth file.
    -> (its bin folder, a working folder, the environment variables)"""
    work = tmp_path_factory.mktemp("wheels")
    env = environment()
    wheels = work / "wheels"
    wheels.mkdir()
    built = build_wheels(_sources(work / "src"), wheels, env=env)
    assert sorted(p.name.split("-")[0] for p in built) == ["seqtrans", "seqtrans_broken", "seqtrans_mytask"]
    bin_ = fresh_venv(work, built, env=env)
    job = work / "job"  # no sources here: only what is installed counts
    job.mkdir()
    return bin_, job, env


def test_the_new_environment_holds_the_wheels_not_the_working_tree(venv: tuple[Path, Path, dict[str, str]]
                                                                   ) -> None:
    bin_, job, env = venv
    done = check(bin_ / "python", "-c", "from importlib.util import find_spec\n"
                 "for m in ('seqtrans', 'seqtrans_mytask', 'torch'): print(find_spec(m).origin)",
                 cwd=job, env=env)
    engine, example, torch_ = map(Path, done.stdout.split())
    assert engine.is_relative_to(bin_.parent) and example.is_relative_to(bin_.parent)
    assert not engine.is_relative_to(ROOT) and "third-party" in torch_.parts


def test_tasks_lists_the_plugin_and_names_the_broken_one(venv: tuple[Path, Path, dict[str, str]]) -> None:
    bin_, job, env = venv
    listed = check(bin_ / "seqtrans", "tasks", cwd=job, env=env).stdout.splitlines()
    rows = {line.split()[0]: line.split(maxsplit=3)[1:] for line in listed[1:]}
    assert set(rows) == {"mytask", "broken"}  # the built-in plugins are not installed there
    distribution, version, status = rows["mytask"]
    assert (distribution, version, status) == ("seqtrans-mytask", "0.1.0", "ok")  # as pyproject names it
    distribution, version, status = rows["broken"]
    assert (distribution, version) == ("seqtrans-broken", "0.3.0")
    assert status.startswith("error: task 'broken' (from ")
    assert "failed to load from broken_task:Nope" in status
    assert "ModuleNotFoundError: No module named 'missing_dependency_of_broken_task'" in status


def test_run_trains_and_scores_the_plugin_beside_the_broken_one(venv: tuple[Path, Path, dict[str, str]]
                                                                ) -> None:
    bin_, job, env = venv
    letters = "abcdef"
    # each rotation of the letters and each prefix, to be reversed
    words = [w for i in range(len(letters)) for w in (letters[i:] + letters[:i], letters[: i + 1])]
    lines = [f"{w}\t{w[::-1]}\n" for w in words]
    for split in ("train", "dev", "test"):
        (job / f"{split}.tsv").write_text("".join(lines), encoding="utf-8")
    check(bin_ / "seqtrans", "-q", "run", "mytask", "--out", "run", "--device", "cpu",
          "--set", "model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=16", "model.d_ff=32",
          "model.heads=2", "train.max_steps=4", "train.eval_every=4", "train.checkpoint_every=4",
          "train.max_minutes=0", "decode.beam=1", "data.train=train.tsv", "data.dev=dev.tsv",
          "data.test=test.tsv", cwd=job, env=env)
    metrics = json.loads((job / "run" / "metrics.json").read_text())
    assert metrics["test_sentences"] == 12 and metrics["skipped"] == 0 and metrics["train_steps"] == 4
    predictions = (job / "run" / "predictions" / "test.txt").read_text().splitlines()
    right = sum(p == w[::-1] for p, w in zip(predictions, words, strict=True))
    assert metrics["exact_match"] == pytest.approx(100 * right / 12) and metrics["cer"] >= 0
    config = json.loads((job / "run" / "config.json").read_text())
    assert config["decode"]["max_len_b"] == 4  # the task's own decoding default
    broken = subprocess.run([bin_ / "seqtrans", "run", "broken", "--out", "b"], cwd=job, env=env,
                            capture_output=True, text=True, timeout=300)
    assert broken.returncode == 2 and "task 'broken' (from seqtrans" in broken.stderr, broken.stderr
