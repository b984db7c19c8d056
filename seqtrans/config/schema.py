"""The schema of a run's configuration: frozen dataclasses whose fields carry their
default and help text, one module per section (:mod:`.model`, :mod:`.train`,
:mod:`.decode`), gathered here into :class:`RunConfig`. Every default lives in those
modules once; the paper's two models are :data:`PRESETS`. The task's own options form
the ``data`` section.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from seqtrans.config.decode import DECODE_PRECISIONS, DecodeConfig
from seqtrans.config.fields import PRECISIONS, option
from seqtrans.config.model import CROSS_MECHANISMS, SELF_MECHANISMS, Mechanism, ModelConfig, check_model
from seqtrans.config.train import TRAIN_PRECISIONS, TrainConfig

__all__ = ["CROSS_MECHANISMS", "DECODE_PRECISIONS", "PRECISIONS", "PRESETS", "SELF_MECHANISMS",
           "TRAIN_PRECISIONS", "DecodeConfig", "Mechanism", "ModelConfig", "RunConfig", "TrainConfig",
           "check_model", "option"]


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs; written to ``DIR/config.json`` fully resolved."""

    task: str = option("copy", "The task plugin's name.")
    seed: int = option(1, "Seed for initialisation, batching, dropout and generated data.")
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "Model shape."})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"help": "Training."})
    decode: DecodeConfig = field(default_factory=DecodeConfig, metadata={"help": "Decoding."})
    data: Any = field(default=None, metadata={"help": "The task's own options."})


# The paper's two models (Table 3) as run-config overrides, usable with any task.
PRESETS: dict[str, dict[str, Any]] = {
    "base": {
        "model": {"encoder_layers": 6, "decoder_layers": 6, "d_model": 512, "d_ff": 2048,
                  "heads": 8, "dropout": 0.1},
        "train": {"average_last": 5, "keep_checkpoints": 5},
    },
    "big": {
        "model": {"encoder_layers": 6, "decoder_layers": 6, "d_model": 1024, "d_ff": 4096,
                  "heads": 16, "dropout": 0.3},
        "train": {"average_last": 20, "keep_checkpoints": 20, "max_steps": 300000},
    },
}
