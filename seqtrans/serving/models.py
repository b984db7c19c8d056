"""The models a server offers, by name: each run (or ensemble) loaded once at start and
described to clients; nothing a request says is taken as a path."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seqtrans import config as cfg
from seqtrans.errors import SeqtransError, UsageError
from seqtrans.inference.loading import Loaded
from seqtrans.tasks.protocol import Multilingual


@dataclass(frozen=True)
class Served:
    """A loaded run offered under ``name``."""

    name: str
    loaded: Loaded

    @property
    def streams(self) -> bool:
        """Whether the model can decode word by word as the source arrives."""
        from seqtrans.streaming.session import check_streaming

        config = self.loaded.config
        greedy = dataclasses.replace(config, decode=dataclasses.replace(config.decode, nbest=1, sample=0))
        try:
            check_streaming(dataclasses.replace(self.loaded, config=greedy))
        except SeqtransError:
            return False
        return True

    def describe(self) -> dict[str, Any]:
        model, codec = self.loaded.config.model, self.loaded.codec
        return {"name": self.name, "task": self.loaded.config.task,
                "decode": cfg.to_dict(self.loaded.config.decode),
                "attention": {"encoder": model.encoder_attention, "decoder": model.decoder_attention,
                              "cross": model.cross_attention},
                "ensemble": len(self.loaded.models), "streaming": self.streams,
                "languages": list(codec.languages) if isinstance(codec, Multilingual) else []}


def model_names(paths: Sequence[str]) -> dict[str, str]:
    """Names for the runs given on the command line: ``NAME=RUN_DIR`` names one, else
    its directory's name (a checkpoint's run directory); ``NAME=RUN_A,RUN_B`` names an
    ensemble, which needs its name. Two runs of one name are refused."""
    names: dict[str, str] = {}
    for given in paths:
        name, sep, path = given.partition("=")
        if not sep:
            if "," in given:
                raise UsageError(f"{given}: an ensemble needs a name: NAME={given}")
            path = given
            where = Path(given).resolve()
            if where.is_file():
                where = where.parent.parent if where.parent.name == "checkpoints" else where.parent
            name = where.name
        if not name or "/" in name:
            raise UsageError(f"{given}: a model name must be non-empty and have no '/'")
        if name in names:
            raise UsageError(f"two models named '{name}' ({names[name]} and {path}): name them "
                             "with NAME=RUN_DIR")
        names[name] = path
    return names


def load_served(name: str, path: str, *, device: str) -> Served:
    """The run (or the ensemble of the comma-separated runs) ``path``, offered as ``name``."""
    from seqtrans.inference.loading import load_ensemble

    return Served(name, load_ensemble(path.split(","), device=device))
