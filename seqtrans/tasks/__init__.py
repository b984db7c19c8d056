"""Task plugins: the contract they keep (:mod:`.protocol`), their discovery through
entry points (:mod:`.discovery`) and a task's run configuration (:mod:`.configuration`).
Importing this package imports no torch."""

from seqtrans.tasks.configuration import resolve_config
from seqtrans.tasks.discovery import GROUP, TaskEntry, find, installed, load
from seqtrans.tasks.protocol import (
    SPLITS,
    Codec,
    Constraining,
    DataDigest,
    Example,
    ModelExtending,
    SegmentationSampling,
    Skipped,
    SourceFormatting,
    TargetParsing,
    Task,
    TaskClass,
    TokenWords,
    TrainingFiles,
    Upgrading,
    check_split,
)

__all__ = ["GROUP", "SPLITS", "Codec", "Constraining", "DataDigest", "Example", "ModelExtending",
           "SegmentationSampling", "Skipped", "SourceFormatting", "TargetParsing", "Task", "TaskClass",
           "TaskEntry", "TokenWords", "TrainingFiles", "Upgrading",
           "check_split", "find", "installed", "load", "resolve_config"]
