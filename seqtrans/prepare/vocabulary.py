"""A prepared dataset's vocabulary: the one a run brings, one an interrupted preparation
built, or one the task builds now from its streamed training examples."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tqdm import tqdm

from seqtrans.runtime.system import release_freed_memory
from seqtrans.tasks import handover
from seqtrans.tasks.protocol import Codec, Example, Skipped, Task

VOCAB = "vocab"  # the vocabulary files' directory in a prepared dataset
COUNT = "count.json"  # the examples counted while building it: the encoding's progress bar total


def examples_of(items: Iterable[Example[Any, Any] | Skipped]) -> Iterator[Example[Any, Any]]:
    """The examples of what :meth:`Task.read` yields, without the :class:`Skipped` records."""
    return (item for item in items if not isinstance(item, Skipped))


def build_codec(task: Task[Any, Any, Any], partial: Path, given: Mapping[str, bytes] | None, *,
                progress: bool) -> Codec[Any, Any, Any]:
    """The codec: from the vocabulary given, or one an interrupted preparation built, or
    built now from the streamed examples (counted on the way, for the progress bar)."""
    directory = partial / VOCAB
    if not directory.is_dir():
        scratch = Path(tempfile.mkdtemp(prefix="vocab-", dir=partial))
        try:
            if given:
                for name, data in given.items():
                    (scratch / name).write_bytes(data)
            else:
                counted = 0
                with tqdm(desc="vocabulary: reading", unit=" examples", unit_scale=True,
                          disable=not progress, leave=False) as bar:
                    def examples() -> Iterator[Example[Any, Any]]:
                        nonlocal counted
                        for ex in examples_of(task.read("train")):
                            counted += 1
                            bar.update(1)
                            yield ex

                    task.build_vocabulary(scratch, examples())
                (partial / COUNT).write_text(json.dumps({"examples": counted}))
            os.replace(scratch, directory)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        release_freed_memory()  # a vocabulary trainer's; this process lives on through training
    return handover.load_codec(task, directory)
