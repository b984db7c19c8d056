"""Machine translation for seqtrans: parallel corpora, shared sentencepiece subwords,
sacreBLEU, and the recipe of "Attention Is All You Need".

Registered in ``pyproject.toml``::

    [project.entry-points."seqtrans.tasks"]
    translation = "seqtrans_translation:TranslationTask"
"""

from seqtrans_translation.config import TranslationConfig
from seqtrans_translation.task import TranslationTask

__all__ = ["TranslationConfig", "TranslationTask"]
