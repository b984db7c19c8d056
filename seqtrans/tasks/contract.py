"""Checks that a task plugin keeps the contract of :class:`~seqtrans.tasks.Task`.

Plugin authors call :func:`check_task` from their own test suites; seqtrans runs it on
every built-in task. It reads a few examples of each split, builds and reloads the
vocabulary, feeds each reference back as a prediction (which must score as the
task's best), and checks that a constraint, if the task has one, admits every
reference.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from pathlib import Path

import torch

from seqtrans import config as cfg
from seqtrans.tasks.protocol import REQUIRED_ATTRIBUTES, SPLITS, Example, Metric, Task
from seqtrans.vocab import EOS


class ContractError(AssertionError):
    """A task does not keep the plugin contract."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ContractError(message)


def check_class(task_cls: type) -> None:
    """Static checks of a task class: attributes, config dataclass, presets resolve."""
    missing = [a for a in REQUIRED_ATTRIBUTES if not hasattr(task_cls, a)]
    _require(not missing, f"missing attributes: {missing}")
    _require(isinstance(task_cls.name, str) and task_cls.name.isidentifier(),  # type: ignore[attr-defined]
             "name must be an identifier")
    _require(dataclasses.is_dataclass(task_cls.Config), "Config must be a dataclass")  # type: ignore[attr-defined]
    _require(isinstance(task_cls.defaults, Mapping) and "decode" in task_cls.defaults,  # type: ignore[attr-defined]
             "defaults must set the decode section")
    for preset in [None, *task_cls.presets]:  # type: ignore[attr-defined]
        cfg.resolve(task_cls.name, data_cls=task_cls.Config,  # type: ignore[attr-defined]
                    task_defaults=task_cls.defaults, task_presets=task_cls.presets,  # type: ignore[attr-defined]
                    preset=preset)
    cfg.describe(cfg.resolve(task_cls.name, data_cls=task_cls.Config))  # type: ignore[attr-defined]


def check_task(task: Task, directory: Path, *, examples: int = 50) -> dict[str, Metric]:
    """Run the contract checks on a configured task instance; returns the metrics of the
    references scored against themselves."""
    check_class(type(task))
    samples: dict[str, list[Example]] = {}
    for split in SPLITS:
        samples[split] = list(itertools.islice(task.read(split), examples))
        _require(bool(samples[split]), f"split '{split}' is empty")
        for ex in samples[split]:
            _require(isinstance(ex, Example), f"read('{split}') must yield Example objects")
    directory.mkdir(parents=True, exist_ok=True)
    vocabs = task.vocabulary(directory, samples["train"])
    reloaded = task.vocabulary(directory, None)
    _require(reloaded == vocabs, "vocabulary() does not reload what it built")

    refs = samples["test"]
    for ex in refs:
        for tok in [*task.source_tokens(ex.source), *task.target_tokens(ex.target)]:
            _require(isinstance(tok, str) and tok != "" and not any(c.isspace() for c in tok),
                     f"{ex.origin}: token {tok!r} is empty or holds white space")
    preds = [task.prediction(task.target_tokens(ex.target), ex.source) for ex in refs]
    for p in preds:
        line = task.format(p)
        _require("\n" not in line, "format() must return a single line")
    scores = task.score(preds, refs)
    _require(task.metric in scores, f"score() lacks the metric '{task.metric}'")
    _require(isinstance(scores[task.metric], (int, float)), f"the metric '{task.metric}' must be a number")
    for key, value in scores.items():
        _require(isinstance(value, (int, float, str)), f"score() value of '{key}' is neither a number "
                                                       "nor a string")

    constraint = task.constraint([ex.source for ex in refs], vocabs)
    if constraint is not None:
        _check_constraint_admits_references(task, constraint, refs, vocabs)
    return dict(scores)


def _check_constraint_admits_references(task: Task, constraint: object, refs: list[Example],
                                        vocabs: object) -> None:
    targets = [vocabs.target.encode(task.target_tokens(ex.target)) + [EOS]  # type: ignore[attr-defined]
               for ex in refs]
    longest = max(len(t) for t in targets)
    for step in range(longest):
        rows = [i for i, t in enumerate(targets) if step < len(t)]
        prefix = torch.tensor([targets[i][:step] for i in rows], dtype=torch.long).view(len(rows), step)
        remaining = torch.tensor([len(targets[i]) - step for i in rows])
        mask = constraint.allowed(prefix, rows=torch.tensor(rows), remaining=remaining)  # type: ignore[attr-defined]
        for j, i in enumerate(rows):
            _require(bool(mask[j, targets[i][step]]),
                     f"{refs[i].origin}: the constraint forbids the reference's token {step + 1}")
