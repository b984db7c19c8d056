"""A third-party plugin as a user gets it: the guide's example (docs/examples/seqtrans-mytask)
and seqtrans itself built into wheels, installed into a fresh virtual environment with
nothing else of this project in it, listed by ``seqtrans tasks``, trained and scored by
``seqtrans run``; beside them a plugin whose import fails is reported by name while
the others keep working."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import ROOT

EXAMPLE = ROOT / "docs" / "examples" / "seqtrans-mytask"
BROKEN_MODULE = ROOT / "tests" / "fake_plugins" / "broken_task.py"
pytestmark = pytest.mark.slow

LEFTOVERS = shutil.ignore_patterns("__pycache__", ".*", "*.egg-info", "build", "dist")

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
    engine, example, broken = work / "seqtrans", work / "seqtrans-mytask", work / "seqtrans-broken"
    shutil.copytree(ROOT / "seqtrans", engine / "seqtrans", ignore=LEFTOVERS)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, engine / name)
    shutil.copytree(EXAMPLE, example, ignore=LEFTOVERS)
    broken.mkdir()
    (broken / "pyproject.toml").write_text(BROKEN_PYPROJECT)
    shutil.copy(BROKEN_MODULE, broken / "broken_task.py")
    return [engine, example, broken]


def _ours(entry: Path) -> bool:
    """Whether a site-packages entry installs or registers part of this project (the
    editable installs of the engine and its plugins, and any other seqtrans plugin)."""
    name = entry.name.lower()
    if name.startswith(("seqtrans", "__editable__", "__pycache__")) or name.endswith((".pth", ".egg-link")):
        return True
    entry_points = entry / "entry_points.txt"
    return name.endswith(".dist-info") and entry_points.is_file() and "[seqtrans." in entry_points.read_text()


def _dependencies(folder: Path) -> Path:
    """A folder of links to everything installed in this environment (torch, numpy, tqdm,
    entrypoints and what they need) but this project: the new environment sees the
    third-party packages and their metadata, not the editable seqtrans and plugins."""
    folder.mkdir()
    sites = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                           *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))])
    for site in sites:
        for entry in sorted(Path(site).iterdir()) if Path(site).is_dir() else []:
            if not _ours(entry) and not (folder / entry.name).exists():
                (folder / entry.name).symlink_to(entry)
    return folder


def _environment() -> dict[str, str]:
    """This process's variables but those that would point Python or pip elsewhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_"))}
    return {**env, "PYTHONNOUSERSITE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _check(*args: str | Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """A new virtual environment holding the wheels of seqtrans, the example and the
    broken plugin, and the test environment's third-party packages through a .pth file.
    -> (its bin folder, a working folder, the environment variables)"""
    work = tmp_path_factory.mktemp("wheels")
    env = _environment()
    wheels = work / "wheels"
    _check(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
           "--wheel-dir", wheels, *_sources(work / "src"), cwd=work, env=env)
    built = sorted(p.name.split("-")[0] for p in wheels.glob("*.whl"))
    assert built == ["seqtrans", "seqtrans_broken", "seqtrans_mytask"], built
    venv = work / "venv"
    _check(sys.executable, "-m", "venv", "--without-pip", venv, cwd=work, env=env)
    python = venv / "bin" / "python"
    site = _check(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                  cwd=work, env=env).stdout.strip()
    (Path(site) / "third_party.pth").write_text(f"{_dependencies(work / 'third-party')}\n")
    _check(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-index", "--no-deps",
           *sorted(wheels.glob("*.whl")), cwd=work, env=env)
    job = work / "job"  # no sources here: only what is installed counts
    job.mkdir()
    return venv / "bin", job, env


def test_the_new_environment_holds_the_wheels_not_the_working_tree(venv: tuple[Path, Path, dict[str, str]]
                                                                   ) -> None:
    bin_, job, env = venv
    done = _check(bin_ / "python", "-c", "from importlib.util import find_spec\n"
                  "for m in ('seqtrans', 'seqtrans_mytask', 'torch'): print(find_spec(m).origin)",
                  cwd=job, env=env)
    engine, example, torch_ = map(Path, done.stdout.split())
    assert engine.is_relative_to(bin_.parent) and example.is_relative_to(bin_.parent)
    assert not engine.is_relative_to(ROOT) and "third-party" in torch_.parts


def test_tasks_lists_the_plugin_and_names_the_broken_one(venv: tuple[Path, Path, dict[str, str]]) -> None:
    bin_, job, env = venv
    listed = _check(bin_ / "seqtrans", "tasks", cwd=job, env=env).stdout.splitlines()
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
    words = "a b c d e f".split()
    # each rotation of the words and each prefix, to be reversed
    sequences = [s for i in range(len(words)) for s in (words[i:] + words[:i], words[: i + 1])]
    lines = [f"{' '.join(s)}\t{' '.join(reversed(s))}\n" for s in sequences]
    for split in ("train", "dev", "test"):
        (job / f"{split}.tsv").write_text("".join(lines), encoding="utf-8")
    _check(bin_ / "seqtrans", "-q", "run", "mytask", "--out", "run", "--device", "cpu",
           "--set", "model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=16", "model.d_ff=32",
           "model.heads=2", "train.max_steps=4", "train.eval_every=4", "train.checkpoint_every=4",
           "train.max_minutes=0", "decode.beam=1", cwd=job, env=env)
    metrics = json.loads((job / "run" / "metrics.json").read_text())
    assert metrics["test_sentences"] == 12 and metrics["skipped"] == 0 and metrics["train_steps"] == 4
    assert 0 <= metrics["exact_match"] <= 1
    predictions = (job / "run" / "predictions" / "test.txt").read_text().splitlines()
    right = sum(p == " ".join(reversed(s)) for p, s in zip(predictions, sequences, strict=True))
    assert metrics["exact_match"] == right / 12
    config = json.loads((job / "run" / "config.json").read_text())
    assert config["decode"]["max_len_b"] == 10  # the task's own decoding default
    broken = subprocess.run([bin_ / "seqtrans", "run", "broken", "--out", "b"], cwd=job, env=env,
                            capture_output=True, text=True, timeout=300)
    assert broken.returncode == 2 and "task 'broken' (from seqtrans" in broken.stderr, broken.stderr
