"""Typed errors with actionable messages.

Every error a user can cause derives from :class:`SeqtransError`; the CLI turns
:class:`UsageError` into exit status 2 and any other into status 1, printing the
message on one line.
"""

from __future__ import annotations

from pathlib import Path


class SeqtransError(Exception):
    """Base class of the errors seqtrans reports to users."""


class UsageError(SeqtransError):
    """A mistake in how seqtrans was called: bad config key or value, unknown preset."""


class ConfigError(UsageError):
    """An unknown configuration key or a value of the wrong type or range."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"config key '{key}': {problem}")
        self.key = key
        self.problem = problem

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str]]:  # raised in worker processes
        return type(self), (self.key, self.problem)


class DataError(SeqtransError):
    """Malformed input data; names the file and, where known, the line."""

    def __init__(self, path: str | Path | None, line: int | None, problem: str) -> None:
        where = str(path) if path is not None else "<input>"
        if line is not None:
            where = f"{where}:{line}"
        super().__init__(f"{where}: {problem}")
        self.path = path
        self.line = line
        self.problem = problem

    def __reduce__(self) -> tuple[type[DataError], tuple[str | Path | None, int | None, str]]:
        return type(self), (self.path, self.line, self.problem)  # raised in worker processes


class TaskError(UsageError):
    """A task plugin could not be found or loaded."""


class CheckpointError(SeqtransError):
    """A checkpoint file is missing, unreadable or does not match the run."""


class DownloadError(SeqtransError):
    """A download failed or did not match its published checksum; names the URL."""


class TrainingError(SeqtransError):
    """Training cannot go on: names the step and what went wrong."""


class Interrupted(SeqtransError):
    """A signal stopped training after a checkpoint of the current update was written."""

    def __init__(self, message: str, signum: int) -> None:
        super().__init__(message)
        self.signum = signum
