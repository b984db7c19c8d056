"""The contract between the engine and a task plugin.

The engine owns the model, training and search; a task owns its data, its metrics
and its decoding defaults. A plugin provides two objects:

- a **task class** (:class:`TaskClass`), registered under the ``seqtrans.tasks``
  entry-point group: its name, its options (``Config``), its defaults and presets, its
  metric, and instances (:class:`Task`) that read data, build vocabularies, parse
  ``predict`` input, format and score predictions;
- a **codec** (:class:`Codec`), returned by :meth:`Task.build_vocabulary` and
  :meth:`Task.load_vocabulary`: the vocabularies and the task's conversions between
  its objects and token strings. Everything that needs the vocabulary lives on the
  codec, so nothing depends on the order of calls, and a codec pickles, so encoding
  can run in worker processes and on other ranks.

A codec may have optional abilities, each a runtime-checkable protocol the engine
tests with ``isinstance``: :class:`Constraining` (restrict next tokens during
search), :class:`SegmentationSampling` (``train.subword_sampling``),
:class:`ModelExtending` (model-side parts of the task's own, :mod:`seqtrans.model.extension`),
:class:`Multilingual` (a model of several languages, bound by ``decode.source_lang`` and
``decode.target_lang``) and :class:`TargetPrefixing` (tokens every output starts with, forced).
A codec without one writes nothing for it. A task may name its training data by a
digest (:class:`DataDigest`), so that prepared data is found without reading the data
again, and a task class may convert runs saved by earlier versions of its plugin
(:class:`Upgrading`).

The type parameters are the task's source, target and prediction types, so
that mypy checks a plugin against the contract::

    _contract: TaskClass[str, str, str] = MyTask

See ``docs/plugins.md``. This module imports neither torch nor any task.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

from seqtrans.data.vocab import Vocabularies
from seqtrans.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from seqtrans.config import ModelConfig
    from seqtrans.decoding.constraints import Constraint
    from seqtrans.model.extension import ModelExtension

#: The contract's names: what ``seqtrans.tasks`` and ``seqtrans.plugin`` give a plugin from
#: this module (the rest is the engine's).
__all__ = ["METRIC_MODES", "SPLITS", "STREAM_UNITS", "CacheDirectory", "Codec", "Constraining", "DataDigest",
           "Example", "Metric", "ModelExtending", "Multilingual", "SegmentationSampling", "Skipped",
           "SourceFormatting", "TargetParsing", "TargetPrefixing", "Task", "TaskClass", "TextForm",
           "TokenWords", "TrainingFiles", "Upgrading", "check_split", "metric_mode", "stream_unit"]

SPLITS = ("train", "dev", "test")

#: A value of :meth:`Task.score`: a number, or a string describing one (a signature).
Metric = float | str

SourceT = TypeVar("SourceT")
TargetT = TypeVar("TargetT")
PredictionT = TypeVar("PredictionT")
SourceT_contra = TypeVar("SourceT_contra", contravariant=True)
TargetT_contra = TypeVar("TargetT_contra", contravariant=True)
PredictionT_co = TypeVar("PredictionT_co", covariant=True)


@dataclass(frozen=True)
class Example(Generic[SourceT, TargetT]):
    """One input and its reference output, as task objects (strings, token lists, trees).

    ``origin`` says where it came from (``file:line``) for error messages.
    """

    source: SourceT
    target: TargetT
    origin: str = ""


@dataclass(frozen=True)
class Skipped:
    """An input that :meth:`Task.read` leaves out, and why (``reason``, a short phrase
    such as ``"empty source or target"``). The engine counts these per split and reason,
    logs them with the first ``origin`` of each reason, and reports the count of the
    scored split as ``skipped`` in its metrics: nothing is dropped silently."""

    origin: str
    reason: str


@runtime_checkable
class Codec(Protocol[SourceT_contra, TargetT_contra, PredictionT_co]):
    """The vocabularies and the task's conversions, in both directions. Must pickle.

    The engine maps token strings to ids with :attr:`vocabularies`, appends the end
    symbol and pads (:func:`seqtrans.data.batches.source_ids` and friends).
    """

    @property
    def vocabularies(self) -> Vocabularies:
        """The source and target vocabularies (the same object twice when shared: the
        model then shares its embeddings)."""
        ...

    def source_tokens(self, source: SourceT_contra) -> list[str]:
        """The source as token strings of the source vocabulary."""
        ...

    def target_tokens(self, target: TargetT_contra) -> list[str]:
        """The reference as token strings of the target vocabulary."""
        ...

    def prediction(self, tokens: list[str], source: SourceT_contra) -> PredictionT_co:
        """Decoded target tokens back as a task object (detokenize, build a tree)."""
        ...


@runtime_checkable
class Task(Protocol[SourceT, TargetT, PredictionT]):
    """What an instance of a task class does. It is built from the resolved ``data``
    section (``TaskClass(config.data)``) and holds only data settings: no method
    depends on another having run."""

    def read(self, split: str) -> Iterator[Example[SourceT, TargetT] | Skipped]:
        """The examples of ``split`` (one of :data:`SPLITS`), in order; an input left out
        is yielded as :class:`Skipped` with the reason.

        Test examples are never reordered. Malformed input raises
        :class:`~seqtrans.errors.DataError` naming the file and line; an unknown split
        raises :class:`~seqtrans.errors.UsageError` (:func:`check_split`).
        """
        ...

    def build_vocabulary(self, directory: Path,
                         train: Iterable[Example[SourceT, TargetT]]) -> Codec[SourceT, TargetT, PredictionT]:
        """Build the vocabularies (and any tokenizer model) into ``directory`` from
        ``train``; return the codec. Everything written there travels inside
        checkpoints, so a checkpoint alone is enough to decode.
        """
        ...

    def load_vocabulary(self, directory: Path) -> Codec[SourceT, TargetT, PredictionT]:
        """The codec of what :meth:`build_vocabulary` wrote into ``directory``."""
        ...

    def parse_source(self, line: str) -> SourceT:
        """A source object from one line of ``seqtrans predict``'s input."""
        ...

    def format(self, prediction: PredictionT) -> str:
        """One line of output for a prediction (no newline)."""
        ...

    def score(self, predictions: Sequence[PredictionT],
              examples: Sequence[Example[SourceT, TargetT]]) -> Mapping[str, Metric]:
        """Metrics of predictions against the examples' targets; must include the
        class's ``metric`` (a number, higher is better). Strings are for descriptions
        such as a metric's signature: they go into ``metrics.json`` and are left out of
        validation."""
        ...


class TaskClass(Protocol[SourceT, TargetT, PredictionT]):
    """What the entry point names: a class (usually) with these attributes, whose
    instances are :class:`Task` objects. Plain class attributes satisfy it. Two more are
    optional: ``metric_mode`` ("max" or "min", :func:`metric_mode`) and ``stream_unit``
    ("words" or "characters", :func:`stream_unit`)."""

    @property
    def name(self) -> str:
        """The name users type, ``seqtrans run NAME``; equal to the entry point's name."""
        ...

    @property
    def Config(self) -> type[DataclassInstance]:  # noqa: N802 (a class, named as one)
        """A frozen dataclass of the task's options, fields made with
        :func:`seqtrans.config.option`: the ``data`` section of the run config."""
        ...

    @property
    def defaults(self) -> Mapping[str, Any]:
        """Run-config overrides that make the task's baseline, applied before any preset;
        at least the decoding defaults, e.g. ``{"decode": {"beam": 4, "alpha": 0.6}}``."""
        ...

    @property
    def presets(self) -> Mapping[str, Mapping[str, Any]]:
        """Named run-config overrides; ``default`` applies when the user names none."""
        ...

    @property
    def metric(self) -> str:
        """The key of :meth:`Task.score`'s result used for validation and early stopping;
        higher is better unless the class says otherwise (:func:`metric_mode`)."""
        ...

    def __call__(self, config: Any) -> Task[SourceT, TargetT, PredictionT]: ...


# --------------------------------------------------------------------------- optional abilities


@runtime_checkable
class Constraining(Protocol[SourceT_contra]):
    """A codec that restricts which tokens may come next during search
    (``decode.constrained``)."""

    def constraint(self, sources: Sequence[SourceT_contra]) -> Constraint | None:
        """A constraint for one batch of sources (its ``rows`` index ``sources``), or None
        for none (a task whose constraint is an option, say)."""
        ...


@runtime_checkable
class Multilingual(Protocol):
    """A codec of a model that reads and writes several languages, each named by a code
    (``decode.source_lang`` and ``decode.target_lang``). Loading binds it to the run's
    languages; a server binds it per request."""

    @property
    def languages(self) -> Sequence[str]:
        """The codes the model knows; empty for a model of one language pair."""
        ...

    def with_languages(self, source: str | None, target: str | None) -> Codec[Any, Any, Any]:
        """This codec bound to ``source`` and ``target`` (None keeps its own); an unknown
        code is a :class:`~seqtrans.errors.ConfigError` that lists the known ones."""
        ...


@runtime_checkable
class TargetPrefixing(Protocol):
    """A codec whose every output starts with tokens it sets (a target language's code):
    decoding gives them to the decoder without scoring them (their log-probability counts
    0, as transformers' ``forced_bos_token_id`` makes it), and the codec's ``prediction``
    leaves them out."""

    def target_prefix(self) -> list[str]:
        """The tokens every output starts with (empty for none)."""
        ...


@runtime_checkable
class SegmentationSampling(Protocol[SourceT_contra]):
    """A codec whose source tokenizer can sample segmentations, for
    ``train.subword_sampling`` (subword regularization, Kudo 2018)."""

    def sample_source_tokens(self, sources: Sequence[SourceT_contra], alpha: float,
                             seed: int) -> list[list[str]]:
        """Every source's tokens with a segmentation sampled at smoothing ``alpha``; the
        same ``seed`` gives the same samples."""
        ...


@runtime_checkable
class ModelExtending(Protocol):
    """A codec that adds model-side parts of its task's own to the Transformer (inputs
    beyond the tokens, state that follows the search): :mod:`seqtrans.model.extension`."""

    def model_extensions(self, model: ModelConfig) -> Mapping[str, ModelExtension]:
        """The extensions for a model of ``model``'s shape (``model.d_model`` wide), by
        name, in the order they are applied; empty when the task's settings ask for none.
        Called once per model built, after the model's own parameters are made (so a
        seed initialises them the same way every time); the settings that decide them
        belong to the task's own config (``data.*``)."""
        ...


@runtime_checkable
class DataDigest(Protocol):
    """A task (not a codec) that names its training data cheaply, so that prepared data
    (``seqtrans prepare``) is found again without reading the data."""

    def train_digest(self) -> str:
        """A string that changes whenever ``read("train")`` or ``build_vocabulary(directory,
        train)`` could give another result: a digest of the training files' contents and
        of the options that shape the training examples and the vocabulary. Without this
        ability the engine reads the training split and hashes what it yields."""
        ...


@runtime_checkable
class CacheDirectory(Protocol):
    """A task's data settings (its ``Config``, not the task) that name where a run keeps
    what it prepares: ``data.cache_dir``, under which the task keeps its downloads and
    models and the engine its prepared datasets (``prepared/``); empty: the default cache
    (``$SEQTRANS_CACHE_DIR``, else ``~/.cache/seqtrans``). One key moves all of a run's
    caches, so that runs that must not share them need not share a machine-wide one."""

    cache_dir: str


@runtime_checkable
class TargetParsing(Protocol):
    """A task (not a codec) that reads a target from one line of text, for scoring given
    pairs (``seqtrans score``)."""

    def parse_target(self, line: str) -> Any:
        """A target object (what :meth:`Codec.target_tokens` takes) from one line; a line
        that holds no valid target raises :class:`~seqtrans.errors.DataError`."""
        ...


@runtime_checkable
class TextForm(Protocol):
    """A task (not a codec) whose sources, targets and predictions each have a text form,
    one line: a run of it may start from the model of a task that reads text
    (``seqtrans run TASK --init RUN_DIR``, a pretrained text-to-text model) and keep that
    model's codec (:mod:`seqtrans.tasks.handover`)."""

    def format_source(self, source: Any) -> str: ...

    def format_target(self, target: Any) -> str: ...

    def parse_prediction(self, line: str, source: Any) -> Any:
        """A prediction (what :meth:`Task.format` takes) from the text a model wrote for
        ``source``; text that holds no valid prediction gives a wrong one, not an error."""
        ...


@runtime_checkable
class TokenWords(Protocol):
    """A codec whose tokens are pieces of words (subwords): the word each token belongs
    to, counted from 0, for word alignments (``predict --alignments``). Without this
    ability every token is a word."""

    def source_words(self, tokens: list[str]) -> list[int]: ...

    def target_words(self, tokens: list[str]) -> list[int]: ...


@runtime_checkable
class SourceFormatting(Protocol):
    """A task (not a codec) that writes a source back as one line of ``predict`` input,
    which :meth:`Task.parse_source` reads back to the same source: for feeding a split's
    sources word by word (``seqtrans evaluate --stream``)."""

    def format_source(self, source: Any) -> str:
        """The source as one input line (no newline), its words separated by whitespace."""
        ...


@runtime_checkable
class TrainingFiles(Protocol):
    """A task (not a codec) whose training split can be read from two line-aligned text
    files that the engine writes: a distilled corpus (``seqtrans distill``), a teacher's
    outputs as the targets of its training sources. A source is written as
    :meth:`format_source` writes it, a target as :meth:`Task.format` writes a prediction
    (with ``--mix``, the original targets as :meth:`format_target` writes them)."""

    def format_source(self, source: Any) -> str:
        """The source as one line (no newline)."""
        ...

    def format_target(self, target: Any) -> str:
        """A training target as one line (no newline), as the training reader reads it back."""
        ...

    def training_files(self, source: Path, target: Path) -> Mapping[str, Any]:
        """The ``data`` settings (key to value) under which ``read("train")`` reads its pairs
        from these two files, one example a line, instead of the configured training data."""
        ...


@runtime_checkable
class Upgrading(Protocol):
    """A task class (not an instance) whose plugin has changed the settings or weights
    its runs are saved with: it converts what an earlier version saved, so that such
    runs load as they did (``seqtrans upgrade RUN_DIR`` writes the conversion back)."""

    def upgrade(self, config: dict[str, Any], weights: dict[str, Any]) -> list[str]:
        """Convert in place a saved run config (the tree of ``config.json``) and, when
        not empty, the model weights of one of its checkpoints (parameter name to
        tensor); return a line for each change made, empty when the run is current.
        Must be idempotent: a converted run comes back unchanged."""
        ...


# --------------------------------------------------------------------------- shared checks

#: Which way a task's metric improves: "max", higher is better (BLEU, F1, accuracy), or
#: "min", lower is (an error rate such as WER).
METRIC_MODES = ("max", "min")


def bind_languages(codec: Codec[Any, Any, Any], *, source: str, target: str) -> Codec[Any, Any, Any]:
    """``codec`` bound to the languages ``decode.source_lang`` and ``decode.target_lang``
    name (empty: the codec's own); a codec that is not :class:`Multilingual` takes none."""
    if isinstance(codec, Multilingual):
        return codec.with_languages(source or None, target or None)
    for key, value in (("decode.source_lang", source), ("decode.target_lang", target)):
        if value:
            raise ConfigError(key, f"is {value!r}, but this model's vocabulary has no language codes; "
                                   "leave it empty")
    return codec


def metric_mode(task_cls: object) -> str:
    """The direction of a task class's ``metric``: its optional ``metric_mode`` class
    attribute, "max" (the default) or "min"; validation and early stopping follow it. A
    value other than those raises :class:`ValueError`."""
    mode = getattr(task_cls, "metric_mode", "max")
    if mode not in METRIC_MODES:
        raise ValueError(f"metric_mode must be 'max' (higher is better) or 'min' (lower is), got {mode!r}")
    return str(mode)


#: What a stream of a task's source is made of (``--stream``, the session API, the
#: WebSocket): "words", separated by white space (the default), or "characters", each
#: one a unit, for a task that reads letters (grapheme-to-phoneme, transliteration).
STREAM_UNITS = ("words", "characters")


def stream_unit(task: object) -> str:
    """The streaming unit of a task class or instance: its optional ``stream_unit`` class
    attribute, "words" (the default) or "characters". A value other than those raises
    :class:`ValueError`."""
    unit = getattr(task, "stream_unit", "words")
    if unit not in STREAM_UNITS:
        raise ValueError(f"stream_unit must be 'words' or 'characters', got {unit!r}")
    return str(unit)


#: The protocols every plugin implements; the optional ones are in
#: :data:`seqtrans.tasks.abilities.ABILITIES`.
REQUIRED: tuple[type, ...] = (Codec, Task, TaskClass)

#: Members the engine requires of a task class (:class:`TaskClass`) and of its
#: instances (:class:`Task`); checked when a plugin is loaded.
CLASS_MEMBERS = ("name", "Config", "defaults", "presets", "metric")
TASK_METHODS = ("read", "build_vocabulary", "load_vocabulary", "parse_source", "format", "score")


def missing_members(task_cls: object) -> list[str]:
    """The members of the contract that ``task_cls`` lacks (``__call__`` when it cannot
    make instances)."""
    missing = [m for m in (*CLASS_MEMBERS, *TASK_METHODS) if not hasattr(task_cls, m)]
    return missing + ([] if callable(task_cls) else ["__call__"])


def check_split(split: str) -> None:
    """Raise the one documented error for a split that is not one of :data:`SPLITS`."""
    if split not in SPLITS:
        raise UsageError(f"unknown split '{split}'; choose one of {', '.join(SPLITS)}")
