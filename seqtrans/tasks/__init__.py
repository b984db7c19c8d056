"""Task plugins: the contract they keep (:mod:`.protocol`), their discovery through
entry points (:mod:`.discovery`) and a task's run configuration (:mod:`.configuration`).
With :mod:`.contract` (``check_task``, for a plugin's tests), this is the API a plugin
is written against. Importing this package imports no torch."""

from seqtrans.tasks.configuration import resolve_config
from seqtrans.tasks.discovery import GROUP, TaskEntry, find, installed, load
from seqtrans.tasks.protocol import (
    METRIC_MODES,
    SPLITS,
    STREAM_UNITS,
    CacheDirectory,
    Codec,
    Constraining,
    DataDigest,
    Example,
    ModelExtending,
    Multilingual,
    SegmentationSampling,
    Skipped,
    SourceFormatting,
    TargetParsing,
    TargetPrefixing,
    Task,
    TaskClass,
    TextForm,
    TokenWords,
    TrainingFiles,
    Upgrading,
    check_split,
    metric_mode,
    stream_unit,
)

__all__ = ["GROUP", "METRIC_MODES", "SPLITS", "STREAM_UNITS", "CacheDirectory", "Codec", "Constraining",
           "DataDigest",
           "Example", "ModelExtending", "Multilingual", "SegmentationSampling", "Skipped",
           "SourceFormatting", "TargetParsing", "TargetPrefixing", "Task", "TaskClass", "TaskEntry",
           "TextForm", "TokenWords", "TrainingFiles", "Upgrading",
           "check_split", "find", "installed", "load", "metric_mode", "resolve_config", "stream_unit"]
