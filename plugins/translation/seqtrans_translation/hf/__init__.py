"""Hugging Face model directories of several families, told apart by ``config.json``'s
``model_type``: ``seqtrans import hf DIR --out RUN_DIR``; see docs/pretrained.md.

Registered in ``pyproject.toml`` under the engine's ``seqtrans.formats`` group; this
module imports torch only when a conversion runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from seqtrans import Loaded


class HF:
    """The format object the engine finds by its entry point."""

    def import_model(self, source: Path, *, out: Path, allow_pickle: bool = False) -> Path:
        from seqtrans_translation.hf.importing import import_hf

        return import_hf(source, out=out, allow_pickle=allow_pickle)

    def export_model(self, loaded: Loaded, *, out: Path) -> Path:
        from seqtrans_translation.hf.exporting import export_hf

        return export_hf(loaded, out=out)


FORMAT = HF()
