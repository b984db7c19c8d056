"""Constituency parsing for seqtrans: Penn Treebank readers, the bracket linearization of
Vinyals et al. (2015), bracket-constrained beam search and an exact reimplementation of
EVALB. Registered as the task ``parsing``; ``seqtrans evalb`` prints EVALB's report.
"""

from seqtrans_parsing.evalb import COLLINS, Parameters, Report, evalb, read_parameters
from seqtrans_parsing.task import Parse, ParsingConfig, ParsingTask, Sentence
from seqtrans_parsing.trees import Tree, preprocess, read_trees

__all__ = ["COLLINS", "Parameters", "Parse", "ParsingConfig", "ParsingTask", "Report", "Sentence", "Tree",
           "evalb", "preprocess", "read_parameters", "read_trees"]
