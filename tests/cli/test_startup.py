"""Commands that need no model start without importing torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

# runs the CLI with argv[1:] and reports on stderr whether torch was imported
PROBE = """
import atexit, sys
atexit.register(lambda: sys.stderr.write("torch imported: %s\\n" % ("torch" in sys.modules)))
from seqtrans.cli import main
sys.exit(main(sys.argv[1:]))
"""


def probe(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True)


@pytest.mark.parametrize("argv", [["--help"], ["tasks"], ["run", "--help"], ["config", "copy"],
                                  ["serve", "--help"]])
def test_commands_that_need_no_model_do_not_import_torch(argv: list[str]) -> None:
    done = probe(*argv)
    assert done.returncode == 0, done.stderr
    assert "torch imported: False" in done.stderr


def test_the_probe_sees_torch_when_a_command_needs_it() -> None:
    done = probe("average", "missing.pt", "--out", "x.pt")
    assert "torch imported: True" in done.stderr
