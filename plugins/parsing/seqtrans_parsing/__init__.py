"""Constituency parsing for seqtrans: Penn Treebank readers, the bracket linearizations of
Vinyals et al. (2015, top-down) and Liu and Zhang (2017, in-order), bracket-constrained
beam search and an exact reimplementation of EVALB. Registered as the task ``parsing``;
``seqtrans evalb`` prints EVALB's report.

Names are imported on first use, so that the EVALB scorer loads without the task.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_NAMES = {
    "COLLINS": "seqtrans_parsing.evalb", "Parameters": "seqtrans_parsing.evalb",
    "Report": "seqtrans_parsing.evalb", "evalb": "seqtrans_parsing.evalb",
    "read_parameters": "seqtrans_parsing.evalb",
    "Parse": "seqtrans_parsing.task", "ParsingCodec": "seqtrans_parsing.task",
    "ParsingConfig": "seqtrans_parsing.task", "ParsingTask": "seqtrans_parsing.task",
    "Sentence": "seqtrans_parsing.task",
    "Tree": "seqtrans_parsing.trees", "preprocess": "seqtrans_parsing.trees",
    "read_trees": "seqtrans_parsing.trees",
}

__all__ = sorted(_NAMES)

if TYPE_CHECKING:
    from seqtrans_parsing.evalb import COLLINS, Parameters, Report, evalb, read_parameters
    from seqtrans_parsing.task import Parse, ParsingCodec, ParsingConfig, ParsingTask, Sentence
    from seqtrans_parsing.trees import Tree, preprocess, read_trees


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'seqtrans_parsing' has no attribute {name!r}")
