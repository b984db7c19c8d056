"""Building a trained run's vocabulary shortlist (``seqtrans shortlist RUN_DIR``) from the
training data it was trained on, read as training reads it (:mod:`seqtrans.prepare`,
which finds the prepared data in its cache or prepares it again)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from seqtrans.inference.loading import find_checkpoint, load, run_directory
from seqtrans.prepare import prepare
from seqtrans.shortlist import table as shortlists

log = logging.getLogger(__name__)


def build_shortlist(run: str | Path, *, settings: shortlists.ShortlistSettings | None = None,
                    progress: bool = False, pairs: tuple[str | Path, str | Path] | None = None,
                    overrides: Sequence[str] = ()) -> Path:
    """Build the shortlist of the run directory (or checkpoint) ``run`` from its training
    pairs and write it to the run directory's ``shortlist.npz``; its path.

    ``pairs``: (source file, target file) of parallel lines to count instead, read as the
    run's task reads training files: the way for an imported model, which was trained on
    no data of the run's. ``overrides``: config keys (``decode.source_lang=...`` for a
    multilingual model, whose language codes are then part of each pair)."""
    keys = list(overrides)
    if pairs is not None:
        keys += ["data.dataset=none", "data.train_tsv=", f"data.train_src={pairs[0]}",
                 f"data.train_tgt={pairs[1]}"]
    loaded = load(run, overrides=[*keys, "decode.precision=fp32", "decode.shortlist=false"], device="cpu")
    prepared = prepare(loaded.task, loaded.config, vocabulary=loaded.assets, progress=progress)
    vocabs = loaded.codec.vocabularies
    built = shortlists.build(prepared.dataset.src, prepared.dataset.tgt, source_size=len(vocabs.source),
                             target_size=len(vocabs.target), vocabulary=loaded.vocabulary_digest,
                             settings=settings)
    path = built.save(run_directory(find_checkpoint(run)) / shortlists.FILE)
    log.info("shortlist of %d pairs written to %s", len(prepared.dataset), path)
    return path
