"""Installs fake distributions (dist-info folders with entry points) into a folder."""

from __future__ import annotations

import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent


def install(folder: Path, distribution: str, version: str, entries: dict[str, str], *,
            group: str = "seqtrans.tasks") -> None:
    """Write ``distribution-version.dist-info`` registering ``entries`` (name -> "module:object")
    under ``group``, and copy this folder's plugin modules beside it."""
    info = folder / f"{distribution}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entries.items())
    (info / "entry_points.txt").write_text(f"[{group}]\n{lines}")
    for module in [*HERE.glob("*_task.py"), *HERE.glob("*_command.py")]:
        shutil.copy(module, folder / module.name)
