"""Task plugins: the protocol they implement and their discovery through entry points."""

from seqtrans.tasks.discovery import GROUP, TaskEntry, find, installed, load
from seqtrans.tasks.protocol import SPLITS, Example, Task

__all__ = ["GROUP", "SPLITS", "Example", "Task", "TaskEntry", "find", "installed", "load"]
