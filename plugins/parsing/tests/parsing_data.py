"""Where the parsing tests' data lives: the shared data directory beside the repository."""

from pathlib import Path

SHARED_DATA = Path(__file__).resolve().parents[4] / "shared" / "data"
