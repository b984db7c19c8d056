"""Where the translation tests' data lives: the shared data directory beside the repository."""

from pathlib import Path

from seqtrans_translation import TranslationConfig, TranslationTask

SHARED_DATA = Path(__file__).resolve().parents[4] / "shared" / "data"
MULTI30K = SHARED_DATA / "multi30k"


def multi30k_task(tmp_path: Path, **options: object) -> TranslationTask:
    """The translation task over the shared Multi30k files as its mirror, caching under ``tmp_path``."""
    options = {"mirror": MULTI30K.as_uri(), "cache_dir": str(tmp_path / "cache"), **options}
    return TranslationTask(TranslationConfig(**options))  # type: ignore[arg-type]
