"""A run of one task that keeps the model and codec of a run of another
(``seqtrans run TASK --init RUN_DIR`` where RUN_DIR's task differs): a pretrained
text-to-text model, say, fine-tuned on any task whose examples have a text form.

The run's task writes its sources and targets as text (:class:`~.protocol.TextForm`);
the model's task reads that text as its own sources and targets (``parse_source``,
:class:`~.protocol.TargetParsing`), its codec cuts them, and a prediction goes back the
same way: the model's task writes its prediction as text (``format``), which the run's
task reads (``parse_prediction``). The run's vocabulary files are the model's with
:data:`FILE` beside them, naming the model's task and its data settings, so that every
later load of the run (resuming, decoding, serving) makes the same codec from the files
alone (:func:`load_codec`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtrans.config import from_dict
from seqtrans.data.vocab import Vocabularies
from seqtrans.errors import DataError
from seqtrans.tasks import discovery
from seqtrans.tasks.protocol import Codec, TargetParsing, TargetPrefixing, Task, TextForm

__all__ = ["FILE", "TextCodec", "files", "load_codec", "problems"]

#: The vocabulary file that names the model's task and its data settings.
FILE = "handover.json"


def problems(task: str, model_task: str) -> list[str]:
    """Why a run of ``task`` cannot keep the codec of a model of ``model_task``: the
    abilities either task lacks (empty when it can)."""
    out = []
    if not isinstance(discovery.load(task), TextForm):
        out.append(f"task '{task}' has no text form (format_source, format_target and parse_prediction, "
                   "seqtrans.tasks.TextForm)")
    if not isinstance(discovery.load(model_task), TargetParsing):
        out.append(f"task '{model_task}' reads no target from text (parse_target, "
                   "seqtrans.tasks.TargetParsing)")
    return out


def files(assets: Mapping[str, bytes], *, model_task: str, model_data: Mapping[str, Any]) -> dict[str, bytes]:
    """The vocabulary files of a run that keeps the codec of a model of ``model_task``
    (with data settings ``model_data``) whose files are ``assets``."""
    record = {"task": model_task, "data": dict(model_data)}
    return {**assets, FILE: json.dumps(record, indent=1, sort_keys=True).encode("utf-8")}


def load_codec(task: Task[Any, Any, Any], directory: Path) -> Codec[Any, Any, Any]:
    """The codec of the vocabulary files in ``directory``: the task's own, or, where
    :data:`FILE` is there, another task's codec seen through ``task``'s text form."""
    path = directory / FILE
    if not path.is_file():
        return task.load_vocabulary(directory)
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        name, data = str(record["task"]), record["data"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DataError(path, None, f"not a record of the model's task and data settings: {exc}") from None
    if not isinstance(task, TextForm):
        raise DataError(path, None, "the run's task has no text form (seqtrans.tasks.TextForm)")
    model_cls = discovery.load(name)
    model_task = model_cls(from_dict(model_cls.Config, data, prefix="data."))
    return TextCodec(task, model_task, model_task.load_vocabulary(directory))


@dataclass(frozen=True)
class TextCodec:
    """The codec of a model of another task, seen through the run's task's text form."""

    task: TextForm
    model_task: Any  # a Task with TargetParsing
    codec: Codec[Any, Any, Any]

    @property
    def vocabularies(self) -> Vocabularies:
        return self.codec.vocabularies

    def _model_source(self, source: Any) -> Any:
        return self.model_task.parse_source(self.task.format_source(source))

    def source_tokens(self, source: Any) -> list[str]:
        return self.codec.source_tokens(self._model_source(source))

    def target_tokens(self, target: Any) -> list[str]:
        return self.codec.target_tokens(self.model_task.parse_target(self.task.format_target(target)))

    def prediction(self, tokens: list[str], source: Any) -> Any:
        text = self.model_task.format(self.codec.prediction(tokens, self._model_source(source)))
        return self.task.parse_prediction(text, source)

    def target_prefix(self) -> list[str]:
        """The model codec's forced first tokens (a target language's code), if it has any."""
        return self.codec.target_prefix() if isinstance(self.codec, TargetPrefixing) else []
