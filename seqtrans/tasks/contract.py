"""Checks that a task plugin keeps the contract of :mod:`seqtrans.tasks.protocol`.

Plugin authors call :func:`check_task` from their own test suites; every built-in
task runs it. It reads a few examples of each split, builds and reloads the
vocabulary, checks that the codec pickles, feeds each reference back as a prediction
(which must score as the task's best), and checks the optional abilities of
:data:`seqtrans.tasks.abilities.ABILITIES` on the object each attaches to: a constraint
must admit every reference, sampled segmentations must repeat for a seed, model
extensions must decode step by step as teacher forcing does. An ability found on
another object than its own is a :class:`ContractWarning`: the engine would ignore it.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import pickle
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from seqtrans import config as cfg
from seqtrans.data.batches import source_ids, target_ids
from seqtrans.data.vocab import EOS
from seqtrans.errors import UsageError
from seqtrans.tasks import protocol
from seqtrans.tasks.abilities import ABILITIES, OBJECTS, Ability
from seqtrans.tasks.protocol import (
    METRIC_MODES,
    SPLITS,
    STREAM_UNITS,
    Codec,
    Constraining,
    Example,
    Metric,
    ModelExtending,
    SegmentationSampling,
    Skipped,
    Task,
    TaskClass,
    missing_members,
)


class ContractError(AssertionError):
    """A task does not keep the plugin contract."""


class ContractWarning(UserWarning):
    """A task class has an attribute the contract does not know whose name is close to
    one it does: most likely a misspelt member or ability, which the engine would ignore."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ContractError(message)


def check_class(task_cls: TaskClass[Any, Any, Any]) -> None:
    """Static checks of a task class: members, options dataclass, presets resolve."""
    missing = missing_members(task_cls)
    _require(not missing, f"missing members: {missing}")
    _require(isinstance(task_cls.name, str) and task_cls.name.isidentifier(), "name must be an identifier")
    _require(dataclasses.is_dataclass(task_cls.Config), "Config must be a dataclass")
    _require(isinstance(task_cls.metric, str), "metric must be a string")
    _require(getattr(task_cls, "metric_mode", "max") in METRIC_MODES,
             f"metric_mode must be one of {', '.join(METRIC_MODES)} (higher or lower is better)")
    _require(getattr(task_cls, "stream_unit", "words") in STREAM_UNITS,
             f"stream_unit must be one of {', '.join(STREAM_UNITS)}")
    _require(isinstance(task_cls.defaults, Mapping) and "decode" in task_cls.defaults,
             "defaults must set the decode section")
    for preset in [None, *task_cls.presets]:
        cfg.resolve(task_cls.name, data_cls=task_cls.Config, task_defaults=task_cls.defaults,
                    task_presets=task_cls.presets, preset=preset)
    cfg.describe(cfg.resolve(task_cls.name, data_cls=task_cls.Config))
    for name, meant in near_misses(task_cls):
        warnings.warn(f"{getattr(task_cls, '__name__', task_cls)}.{name} is no name of the plugin contract "
                      f"and is ignored; did you mean '{meant}'?", ContractWarning, stacklevel=2)


def contract_names() -> frozenset[str]:
    """Every name the contract gives a meaning: the required members, the optional class
    attributes, and the members of each required protocol and optional ability."""
    names = {*protocol.CLASS_MEMBERS, *protocol.TASK_METHODS, "metric_mode", "stream_unit"}
    for declared in protocol.REQUIRED:
        names.update(n for n in (*vars(declared), *getattr(declared, "__annotations__", {}))
                     if not n.startswith("_"))
    for ability in ABILITIES:
        names.update(ability.members)
    return frozenset(names)


def near_misses(task_cls: object) -> list[tuple[str, str]]:
    """The public attributes the task class defines (itself or a base of its own) that
    the contract does not know, each with the contract name it is close to, if any."""
    known = contract_names()
    own = {name for klass in getattr(task_cls, "__mro__", ())
           if klass.__module__ not in ("builtins", "typing", protocol.__name__)
           for name in vars(klass) if not name.startswith("_")}
    found = []
    for name in sorted(own - known):
        # the name, or what follows its first word where that is no contract name itself
        # ("decode_defualts"); "source_format" names its own thing
        tail = name.split("_", 1)[1] if "_" in name else ""
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8) or (
            difflib.get_close_matches(tail, known, n=1, cutoff=0.8) if tail and tail not in known else [])
        if close:
            found.append((name, close[0]))
    return found


def check_task(task: Task[Any, Any, Any], directory: Path, *, examples: int = 50) -> dict[str, Metric]:
    """Run the contract checks on a configured task instance; returns the metrics of the
    references scored against themselves. It reads at most ``examples`` of each split, and
    each split must give at least one: a fixture of one example, the same file for all
    three splits, is enough."""
    task_cls = cast(TaskClass[Any, Any, Any], type(task))
    check_class(task_cls)
    samples = {split: _sample(task, split, examples) for split in SPLITS}
    try:
        next(iter(task.read("validation")))
    except UsageError:
        pass
    else:
        raise ContractError("read() of an unknown split must raise UsageError (seqtrans.tasks.check_split)")

    directory.mkdir(parents=True, exist_ok=True)
    codec = task.build_vocabulary(directory, samples["train"])
    reloaded = task.load_vocabulary(directory)
    for method, made in (("build_vocabulary", codec), ("load_vocabulary", reloaded)):
        _require(isinstance(made, Codec), f"{method}() returned {type(made).__name__}, not a codec")
    _require(reloaded.vocabularies == codec.vocabularies,
             "load_vocabulary() does not load what build_vocabulary() built")
    try:
        copied = pickle.loads(pickle.dumps(codec))
    except Exception as exc:  # any failure to pickle breaks worker processes
        raise ContractError(f"the codec does not pickle: {type(exc).__name__}: {exc}") from None

    refs = samples["test"]
    for ex in refs:
        tokens = [*codec.source_tokens(ex.source), *codec.target_tokens(ex.target)]
        for tok in tokens:
            _require(isinstance(tok, str) and tok != "" and not any(c.isspace() for c in tok),
                     f"{ex.origin}: token {tok!r} is empty or holds white space")
        _require(copied.source_tokens(ex.source) == codec.source_tokens(ex.source)
                 and copied.target_tokens(ex.target) == codec.target_tokens(ex.target),
                 f"{ex.origin}: a pickled copy of the codec tokenizes differently")
    preds = [codec.prediction(codec.target_tokens(ex.target), ex.source) for ex in refs]
    for p in preds:
        _require("\n" not in task.format(p), "format() must return a single line")
    scores = task.score(preds, refs)
    _require(task_cls.metric in scores, f"score() lacks the metric '{task_cls.metric}'")
    _require(isinstance(scores[task_cls.metric], (int, float)),
             f"the metric '{task_cls.metric}' must be a number")
    for key, value in scores.items():
        _require(isinstance(value, (int, float, str)), f"score() value of '{key}' is neither a number "
                                                       "nor a string")
    _check_abilities(task, codec, refs)
    return dict(scores)


def _sample(task: Task[Any, Any, Any], split: str, examples: int) -> list[Example[Any, Any]]:
    """Up to ``examples`` examples of ``split``; an error that names the split and what to
    do when it cannot be read or yields none (every split needs one: the vocabulary is
    built from train, the references come from test, validation reads dev)."""
    todo = ("check_task reads every split: configure the task with a small fixture for each "
            "(one file of a few examples may serve all three)")
    try:
        read = list(itertools.islice(task.read(split), examples))
    except UsageError:
        raise
    except Exception as exc:  # the task's own failure: say which split, keep the cause
        raise ContractError(f"split '{split}' cannot be read ({type(exc).__name__}: {exc}); {todo}") from exc
    found = [ex for ex in read if isinstance(ex, Example)]
    if not found:
        left_out = sorted({item.reason for item in read if isinstance(item, Skipped)})
        why = (f"the task left out all {len(read)} it read ({'; '.join(left_out)})" if left_out
               else "it is empty")
        raise ContractError(f"split '{split}' yields no examples: {why}; {todo}")
    return found


def _check_abilities(task: Task[Any, Any, Any], codec: Codec[Any, Any, Any],
                     refs: list[Example[Any, Any]]) -> None:
    """Each ability of the table on the object it attaches to, checked where the contract
    asks more than its signature; found on another object instead, a warning (the engine
    never looks for it there)."""
    task_cls = cast(TaskClass[Any, Any, Any], type(task))
    objects = {"codec": codec, "task": task, "task class": task_cls, "config": task_cls.Config}
    checks: dict[type, Callable[[Any, list[Example[Any, Any]]], None]] = {
        Constraining: _check_constraint_admits_references, SegmentationSampling: _check_sampling,
        ModelExtending: _check_extensions}
    for ability in ABILITIES:
        if isinstance(objects[ability.attaches_to], ability.protocol):
            check = checks.get(ability.protocol)
            if check is not None:
                check(codec, refs)
            continue
        for place in _elsewhere(ability):
            if isinstance(objects[place], ability.protocol):
                warnings.warn(misplaced(ability, place, objects[place]), ContractWarning, stacklevel=3)


def _elsewhere(ability: Ability) -> list[str]:
    """The objects an ability does not attach to; a task class has its instances' methods,
    so those two count as one."""
    same = {"task", "task class"} if ability.attaches_to in ("task", "task class") else {ability.attaches_to}
    return [place for place in OBJECTS if place not in same | {"task class"}]


def misplaced(ability: Ability, place: str, found: object) -> str:
    """The warning for ``ability`` found on the object ``place`` names instead of its own."""
    owner = found if isinstance(found, type) else type(found)
    own = ability.attaches_to
    return (f"{owner.__name__} ({place}) has {', '.join(ability.members)}, the {ability.name} ability of the "
            f"{own}: the engine looks for it on the {own} only and ignores it here")


def _check_sampling(codec: Any, refs: list[Example[Any, Any]]) -> None:
    sources = [ex.source for ex in refs]
    first = codec.sample_source_tokens(sources, 0.5, 7)
    _require(len(first) == len(sources), "sample_source_tokens() must return one list per source")
    _require(first == codec.sample_source_tokens(sources, 0.5, 7),
             "sample_source_tokens() must repeat its samples for the same seed")


def _check_extensions(codec: Any, refs: list[Example[Any, Any]]) -> None:
    """A tiny model with the codec's extensions: they are ModelExtensions, saved with the
    model, and decoding step by step gives what teacher forcing gives."""
    refs = refs[:4]  # a batch of a few sentences exercises every hook
    import torch

    from seqtrans.config import ModelConfig
    from seqtrans.data.batches import pad_batch
    from seqtrans.data.vocab import BOS
    from seqtrans.model.extension import ModelExtension
    from seqtrans.model.transformer import build_model

    config = ModelConfig(encoder_layers=1, decoder_layers=1, d_model=16, d_ff=32, heads=2, dropout=0.0)
    extensions = codec.model_extensions(config)
    for name, extension in extensions.items():
        _require(isinstance(extension, ModelExtension), f"model_extensions() gave '{name}', a "
                 f"{type(extension).__name__}, not a seqtrans.model.extension.ModelExtension")
    torch.manual_seed(0)
    model = build_model(config, codec).eval()
    saved = {k.split(".")[1] for k in model.state_dict() if k.startswith("extensions.")}
    _require(saved == {n for n, e in extensions.items() if any(True for _ in e.state_dict())},
             "the model extensions' parameters must be saved with the model (extensions.NAME.*)")
    src = pad_batch([source_ids(codec, ex.source) for ex in refs])  # [B, S]
    tgt = pad_batch([target_ids(codec, ex.target) for ex in refs], before=BOS)  # [B, T]
    with torch.no_grad():
        encoded = model.encode(src)
        whole = model.decode(tgt, encoded)  # [B, T, V]
        state = model.start(encoded, capacity=tgt.size(1))
        steps = torch.cat([model.decode(tgt[:, t:t + 1], state=state) for t in range(tgt.size(1))], 1)
    _require(torch.allclose(whole, steps, atol=1e-5), "a model extension's step() must add what its "
             "decoder_input() adds for the same tokens (decoding step by step differs from teacher forcing)")


def _check_constraint_admits_references(codec: Any, refs: list[Example[Any, Any]]) -> None:
    import torch

    constraint = codec.constraint([ex.source for ex in refs])
    if constraint is None:
        return
    targets = [target_ids(codec, ex.target) + [EOS] for ex in refs]
    longest = max(len(t) for t in targets)
    for step in range(longest):
        rows = [i for i, t in enumerate(targets) if step < len(t)]
        prefix = torch.tensor([targets[i][:step] for i in rows], dtype=torch.long).view(len(rows), step)
        remaining = torch.tensor([len(targets[i]) - step for i in rows])
        mask = constraint.allowed(prefix, rows=torch.tensor(rows), remaining=remaining)
        for j, i in enumerate(rows):
            _require(bool(mask[j, targets[i][step]]),
                     f"{refs[i].origin}: the constraint forbids the reference's token {step + 1}")
