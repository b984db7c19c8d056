"""EVALB, the bracket scorer of Sekine and Collins (1997; Ellis' 2006 revision), in Python.

:func:`evalb` scores; :mod:`.params` reads parameter files, :mod:`.reading` reads a
line as the program does, :mod:`.report` formats what it prints; see
:mod:`.scoring` for what is reproduced and what is defined where the program's
behaviour is not.
"""

from seqtrans_parsing.evalb.params import COLLINS, Parameters, parse_parameters, read_parameters
from seqtrans_parsing.evalb.report import Report, SentenceResult, Summary
from seqtrans_parsing.evalb.scoring import evalb

__all__ = ["COLLINS", "Parameters", "Report", "SentenceResult", "Summary", "evalb", "parse_parameters",
           "read_parameters"]
