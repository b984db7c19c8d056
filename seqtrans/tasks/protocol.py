"""The contract between the engine and a task plugin.

The engine owns the model, training and search; a task owns its data, its
tokenization, its metrics and its decoding defaults. A plugin is a class that
satisfies :class:`Task`, registered under the ``seqtrans.tasks`` entry-point group.
See ``docs/plugins.md`` for a walk-through with the ``copy`` task.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from seqtrans.vocab import Vocabularies

if TYPE_CHECKING:
    from seqtrans.decoding.constraints import Constraint

SPLITS = ("train", "dev", "test")

#: A value of :meth:`Task.score`: a number, or a string describing one (a signature).
Metric = float | str


@dataclass(frozen=True)
class Example:
    """One input and its reference output, as task objects (strings, token lists, trees).

    ``origin`` says where it came from (``file:line``) for error messages.
    """

    source: Any
    target: Any = None
    origin: str = ""


@runtime_checkable
class Task(Protocol):
    """What a task plugin provides. All methods are called on an instance built from
    the resolved ``data`` section: ``TaskClass(config.data)``."""

    #: The name users type: ``seqtrans run NAME``. Must equal the entry point's name.
    name: ClassVar[str]
    #: A frozen dataclass of the task's options: the ``data`` section of the run config.
    Config: ClassVar[type]
    #: Run-config overrides that make the task's baseline, applied before any preset;
    #: at least the decoding defaults, e.g. ``{"decode": {"beam": 4, "alpha": 0.6}}``.
    defaults: ClassVar[Mapping[str, Any]]
    #: Named run-config overrides; ``default`` applies when the user names none.
    presets: ClassVar[Mapping[str, Mapping[str, Any]]]
    #: The key of :meth:`score`'s result used for validation and early stopping
    #: (higher is better).
    metric: ClassVar[str]

    def __init__(self, config: Any) -> None:
        """Build the task from its resolved options (an instance of :attr:`Config`)."""

    def read(self, split: str) -> Iterator[Example]:
        """The examples of ``split`` (one of :data:`SPLITS`), in order.

        Test examples must never be dropped or reordered. Malformed input raises
        :class:`~seqtrans.errors.DataError` naming the file and line.
        """
        ...

    def vocabulary(self, directory: Path, train: Iterable[Example] | None) -> Vocabularies:
        """Build the vocabularies (and any tokenizer model) into ``directory`` from
        ``train``, or, when ``train`` is None, load them from ``directory``.

        Everything the task writes there travels inside checkpoints, so a checkpoint
        alone is enough to decode.
        """
        ...

    def source_tokens(self, source: Any) -> list[str]:
        """The source as token strings of the source vocabulary."""
        ...

    def target_tokens(self, target: Any) -> list[str]:
        """The reference as token strings of the target vocabulary."""
        ...

    def prediction(self, tokens: list[str], source: Any) -> Any:
        """Turn decoded target tokens back into a task object (detokenize, build a tree)."""
        ...

    def parse_source(self, line: str) -> Any:
        """A source object from one line of ``seqtrans predict``'s input."""
        ...

    def format(self, prediction: Any) -> str:
        """One line of output for a prediction (no newline)."""
        ...

    def score(self, predictions: Sequence[Any], examples: Sequence[Example]) -> Mapping[str, Metric]:
        """Metrics of predictions against the examples' targets; must include :attr:`metric`
        (a number). Strings are for descriptions such as a metric's signature: they go
        into ``metrics.json`` and are left out of validation."""
        ...

    def constraint(self, sources: Sequence[Any], vocabularies: Vocabularies) -> Constraint | None:
        """An optional restriction of next tokens for a batch of sources; None for none."""
        ...


# Optional, for ``train.subword_sampling`` (subword regularization, Kudo 2018):
#
#     def sample_source_tokens(self, sources: Sequence[Any], alpha: float, seed: int) -> list[list[str]]:
#         """The sources as token strings, each with a segmentation sampled at smoothing
#         ``alpha``; the same ``seed`` gives the same samples."""
#
# The engine calls it once per training epoch; a task without it rejects the option.

REQUIRED_ATTRIBUTES = ("name", "Config", "defaults", "presets", "metric", "read", "vocabulary",
                       "source_tokens", "target_tokens", "prediction", "parse_source", "format",
                       "score", "constraint")
