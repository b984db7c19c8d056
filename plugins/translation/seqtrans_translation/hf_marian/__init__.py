"""The Hugging Face Marian format (OPUS-MT models): ``seqtrans import hf-marian DIR
--out RUN_DIR`` and ``seqtrans export RUN_DIR --to hf-marian OUT``; see docs/pretrained.md.

Registered in ``pyproject.toml`` under the engine's ``seqtrans.formats`` group; this
module imports torch only when a conversion runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from seqtrans import Loaded


class HFMarian:
    """The format object the engine finds by its entry point."""

    def import_model(self, source: Path, *, out: Path, allow_pickle: bool = False) -> Path:
        from seqtrans_translation.hf_marian.importing import import_marian

        return import_marian(source, out=out, allow_pickle=allow_pickle)

    def export_model(self, loaded: Loaded, *, out: Path) -> Path:
        from seqtrans_translation.hf_marian.exporting import export_marian

        return export_marian(loaded, out=out)


FORMAT = HFMarian()
