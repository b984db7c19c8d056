"""seqtrans: sequence transduction with the Transformer and task plugins.

The public API, the same operations as the command line::

    import seqtrans
    config = seqtrans.resolve_config("copy", overrides=["train.max_steps=500"])
    metrics = seqtrans.run(config, "runs/copy")
    model = seqtrans.load("runs/copy")
    model.predict(["3 1 4 1 5"])                       # lines of text in, output text out
    predictions, nbest = model.decode(model.parse(["3 1 4 1 5"]))  # parsed sources: hypotheses
    model.score(["3 1 4"], ["3 1 4"])                  # log P(target | source) of each pair
    options = seqtrans.OutputOptions(format="jsonl", token_log_probs=True, alignments=True)
    for line in seqtrans.predict(model, ["3 1 4 1 5"], output=options):  # as `seqtrans predict`
        print(line)
    session = seqtrans.stream(model)   # a model that can stream: words in, tokens out
    session.push("3 1 4"); session.finish()
    seqtrans.evaluate("runs/copy", split="test")
    seqtrans.average(["a.pt", "b.pt"], "avg.pt")
    seqtrans.export("runs/copy", to="ctranslate2", out="ct2-copy")  # as `seqtrans export`
    seqtrans.build_shortlist("runs/copy")              # as `seqtrans shortlist runs/copy`
    start = seqtrans.initial("runs/copy")              # as `seqtrans run --init runs/copy`
    tuned = seqtrans.with_initial_model(seqtrans.resolve_config("copy"), start)
    seqtrans.run(tuned, "runs/copy-tuned", init=start)
    seqtrans.tasks.installed()

Names are imported on first use, so ``import seqtrans`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from seqtrans import _moved

__version__ = "0.2.0"

_moved.install()

_API = {
    "resolve_config": "seqtrans.tasks.configuration",
    "run": "seqtrans.pipeline",
    "load": "seqtrans.inference.loading",
    "load_ensemble": "seqtrans.inference.loading",
    "Ensemble": "seqtrans.decoding.ensemble",
    "score_files": "seqtrans.inference.scoring",
    "PairScore": "seqtrans.inference.scoring",
    "evaluate": "seqtrans.inference.loading",
    "predict": "seqtrans.inference.online",
    "OutputOptions": "seqtrans.inference.output",
    "set_threads": "seqtrans.runtime.threads",
    "set_wait_policy": "seqtrans.runtime.threads",
    "stream": "seqtrans.streaming.session",
    "StreamSession": "seqtrans.streaming.session",
    "average": "seqtrans.pipeline",
    "initial": "seqtrans.training.initial",
    "Initial": "seqtrans.training.initial",
    "with_initial_model": "seqtrans.training.initial",
    "vocabulary_of": "seqtrans.training.initial",
    "export": "seqtrans.inference.export",
    "build_shortlist": "seqtrans.shortlist.build",
    "ShortlistSettings": "seqtrans.shortlist.table",
    "Loaded": "seqtrans.inference.loaded",
    "RunConfig": "seqtrans.config",
    "ModelConfig": "seqtrans.config",
    "TrainConfig": "seqtrans.config",
    "DecodeConfig": "seqtrans.config",
    "Transformer": "seqtrans.model.transformer",
    "build_model": "seqtrans.model.transformer",
    "Vocab": "seqtrans.data.vocab",
    "Vocabularies": "seqtrans.data.vocab",
    "Codec": "seqtrans.tasks.protocol",
    "Example": "seqtrans.tasks.protocol",
    "Skipped": "seqtrans.tasks.protocol",
    "Task": "seqtrans.tasks.protocol",
    "TaskClass": "seqtrans.tasks.protocol",
    "Constraint": "seqtrans.decoding.constraints",
    "Hypothesis": "seqtrans.decoding.search",
    "SeqtransError": "seqtrans.errors",
    "ConfigError": "seqtrans.errors",
    "DataError": "seqtrans.errors",
    "UsageError": "seqtrans.errors",
}

__all__ = sorted([*_API, "tasks", "__version__"])

if TYPE_CHECKING:
    from seqtrans import tasks
    from seqtrans.config import DecodeConfig, ModelConfig, RunConfig, TrainConfig
    from seqtrans.data.vocab import Vocab, Vocabularies
    from seqtrans.decoding.constraints import Constraint
    from seqtrans.decoding.ensemble import Ensemble
    from seqtrans.decoding.search import Hypothesis
    from seqtrans.errors import ConfigError, DataError, SeqtransError, UsageError
    from seqtrans.inference.export import export
    from seqtrans.inference.loaded import Loaded
    from seqtrans.inference.loading import evaluate, load, load_ensemble
    from seqtrans.inference.online import predict
    from seqtrans.inference.output import OutputOptions
    from seqtrans.inference.scoring import PairScore, score_files
    from seqtrans.model.transformer import Transformer, build_model
    from seqtrans.pipeline import average, run
    from seqtrans.runtime.threads import set_threads, set_wait_policy
    from seqtrans.shortlist.build import build_shortlist
    from seqtrans.shortlist.table import ShortlistSettings
    from seqtrans.streaming.session import StreamSession, stream
    from seqtrans.tasks.configuration import resolve_config
    from seqtrans.tasks.protocol import Codec, Example, Skipped, Task, TaskClass
    from seqtrans.training.initial import Initial, initial, vocabulary_of, with_initial_model


def __dir__() -> list[str]:
    """The public names, loaded or not: what ``dir(seqtrans)`` and completion show."""
    return list(__all__)


def __getattr__(name: str) -> Any:
    if name == "tasks":
        return importlib.import_module("seqtrans.tasks")
    if name in _API:
        return getattr(importlib.import_module(_API[name]), name)
    raise AttributeError(f"module 'seqtrans' has no attribute {name!r}")
