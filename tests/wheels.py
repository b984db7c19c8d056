"""Wheels installed into a fresh virtual environment, as a user installs them: the engine
built from the working tree, plugins beside it, and the test environment's third-party
packages (torch and the rest) seen through a ``.pth`` file instead of installed again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path

from conftest import ROOT

LEFTOVERS = shutil.ignore_patterns("__pycache__", ".*", "*.egg-info", "build", "dist")


def engine_source(work: Path) -> Path:
    """A copy of the engine's project to build (a build writes beside its sources)."""
    engine = work / "seqtrans"
    shutil.copytree(ROOT / "seqtrans", engine / "seqtrans", ignore=LEFTOVERS)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, engine / name)
    return engine


def ours(entry: Path) -> bool:
    """Whether a site-packages entry installs or registers part of this project (the
    editable installs of the engine and its plugins, and any other seqtrans plugin)."""
    name = entry.name.lower()
    if name.startswith(("seqtrans", "__editable__", "__pycache__")) or name.endswith((".pth", ".egg-link")):
        return True
    entry_points = entry / "entry_points.txt"
    return name.endswith(".dist-info") and entry_points.is_file() and "[seqtrans." in entry_points.read_text()


def dependencies(folder: Path) -> Path:
    """A folder of links to everything installed in this environment (torch, numpy, tqdm,
    entrypoints and what they need) but this project: the new environment sees the
    third-party packages and their metadata, not the editable seqtrans and plugins."""
    folder.mkdir()
    sites = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                           *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))])
    for site in sites:
        for entry in sorted(Path(site).iterdir()) if Path(site).is_dir() else []:
            if not ours(entry) and not (folder / entry.name).exists():
                (folder / entry.name).symlink_to(entry)
    return folder


def environment() -> dict[str, str]:
    """This process's variables but those that would point Python or pip elsewhere."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_"))}
    return {**env, "PYTHONNOUSERSITE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def check(*args: str | Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run a command; fail the test with its output unless it succeeds."""
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done


def build_wheels(sources: Sequence[Path], wheels: Path, *, env: dict[str, str]) -> list[Path]:
    """Wheels of the projects ``sources`` in ``wheels``, built offline with this environment's
    setuptools."""
    check(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
          "--wheel-dir", wheels, *sources, cwd=wheels.parent, env=env)
    return sorted(wheels.glob("*.whl"))


def fresh_venv(work: Path, wheels: Sequence[Path], *, env: dict[str, str]) -> Path:
    """A new virtual environment in ``work/venv`` holding ``wheels`` (installed without
    their dependencies) and this environment's third-party packages; -> its bin folder."""
    venv = work / "venv"
    check(sys.executable, "-m", "venv", "--without-pip", venv, cwd=work, env=env)
    python = venv / "bin" / "python"
    site = check(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                 cwd=work, env=env).stdout.strip()
    (Path(site) / "third_party.pth").write_text(f"{dependencies(work / 'third-party')}\n")
    check(sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-index", "--no-deps",
          *wheels, cwd=work, env=env)
    return venv / "bin"
