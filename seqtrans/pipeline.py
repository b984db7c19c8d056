"""The operations behind the CLI, as functions: run, evaluate, load, average
(``predict`` and streaming, which decode input as it arrives, are in :mod:`seqtrans.online`).

A run directory holds ``config.json``, ``vocab/`` (the task's files),
``checkpoints/`` (step checkpoints and ``average.pt``), ``predictions/test.txt``,
``metrics.json`` and ``train.jsonl`` (log records).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from seqtrans import atomic, distributed, tasks
from seqtrans import config as cfg
from seqtrans.assets import assets_digest, read_assets, write_assets
from seqtrans.config import DecodeConfig, RunConfig
from seqtrans.config import resolve_config as resolve_config  # part of the operations API
from seqtrans.data import Pairs, check_sources, encode_pairs, prediction, source_ids
from seqtrans.decoding import Hypothesis, generate
from seqtrans.ensemble import Ensemble, members, position_limit
from seqtrans.errors import CheckpointError, ConfigError, UsageError
from seqtrans.model import Transformer, build_model
from seqtrans.prepare import examples_of, prepare
from seqtrans.tasks.protocol import (
    Codec,
    Constraining,
    Example,
    Metric,
    SegmentationSampling,
    Skipped,
    Task,
    check_split,
)
from seqtrans.training import checkpoint
from seqtrans.training.loop import Trainer
from seqtrans.training.tracking import require_tensorboard
from seqtrans.upgrade import check_current, upgrade_checkpoint
from seqtrans.vocab import EOS

log = logging.getLogger(__name__)

AVERAGE = "average.pt"


def select_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")
    if name not in ("cpu", "cuda"):
        raise UsageError(f"--device must be auto, cpu or cuda, got {name!r}")
    return torch.device(name)


@dataclass
class Loaded:
    """A trained model with its task and codec, ready to decode; with ``others``, an
    ensemble of models of one vocabulary (:mod:`seqtrans.ensemble`) whose task, codec
    and decoding settings are the first's."""

    config: RunConfig
    task: Task[Any, Any, Any]
    codec: Codec[Any, Any, Any]
    model: Transformer
    device: torch.device
    others: list[Transformer] = field(default_factory=list)  # further members of an ensemble
    vocabulary_digest: str = ""  # sha256 of the vocabulary files the model was trained with

    @property
    def models(self) -> list[Transformer]:
        return [self.model, *self.others]

    @property
    def searcher(self) -> Transformer | Ensemble:
        """What decodes: the model, or the ensemble of all models."""
        return Ensemble(self.models) if self.others else self.model

    def decode(self, sources: Sequence[Any], *, decode: DecodeConfig | None = None,
               progress: bool = False) -> tuple[list[Any], list[list[Hypothesis]]]:
        """Predictions (task objects) and the n-best hypotheses of ``sources``, in order."""
        return decode_sources(self.searcher, self.codec, sources, decode or self.config.decode,
                              device=self.device, progress=progress)


def decode_sources(model: Transformer | Ensemble, codec: Codec[Any, Any, Any], sources: Sequence[Any],
                   decode: DecodeConfig, *, device: torch.device, progress: bool = False,
                   spread: bool = False) -> tuple[list[Any], list[list[Hypothesis]]]:
    """Predictions and n-best hypotheses of ``sources``, in order. With ``spread``, in a
    process group, every rank decodes a share (by length, in turn) and all ranks get
    all outputs back in input order."""
    world = distributed.current()
    if spread and world.distributed:
        lengths = [len(source_ids(codec, s)) for s in sources]
        mine = distributed.spread(lengths, world)
        preds, hyps = decode_sources(model, codec, [sources[i] for i in mine], decode, device=device,
                                     progress=progress and world.main)
        return (distributed.gather_in_order(len(sources), mine, preds),
                distributed.gather_in_order(len(sources), mine, hyps))
    ids = [source_ids(codec, s) for s in sources]
    limit = position_limit(model)
    constraints = None
    if isinstance(codec, Constraining):
        constrained = codec

        def constraints(idx: list[int]) -> Any:
            return constrained.constraint([sources[i] for i in idx])

    hyps = generate(model, ids, decode, device=device, constraints=constraints,
                    position_limit=limit, progress=progress)
    preds = [prediction(codec, h[0].tokens if h else [], s) for h, s in zip(hyps, sources)]
    return preds, hyps


@dataclass
class Split:
    """The examples of one split, and what the task left out of it (:class:`Skipped`)."""

    examples: list[Example[Any, Any]]
    skipped: Counter[str] = field(default_factory=Counter)  # reason -> count


def read_split(task: Task[Any, Any, Any], split: str) -> Split:
    """Read a split whole; the inputs the task left out are counted by reason and logged
    with the first origin of each reason."""
    check_split(split)
    out = Split([])
    first: dict[str, str] = {}
    for item in task.read(split):
        if isinstance(item, Skipped):
            out.skipped[item.reason] += 1
            first.setdefault(item.reason, item.origin)
        else:
            out.examples.append(item)
    for reason, count in out.skipped.items():
        log.warning("%s: left out %d of %d inputs: %s (first: %s)", split, count,
                    len(out.examples) + sum(out.skipped.values()), reason, first[reason])
    return out


def _seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def _check_resumable(out: Path, config: RunConfig) -> None:
    saved_path = out / "config.json"
    if not saved_path.exists():
        return
    check_current(out)
    saved = json.loads(saved_path.read_text(encoding="utf-8"))
    for key in ("task", "seed", "model", "data"):
        same = (cfg.same_settings(saved.get(key), getattr(config, key)) if key in ("model", "data")
                else saved.get(key) == getattr(config, key))
        if not same:
            raise UsageError(
                f"{out} holds a run with different '{key}' settings; choose a new --out "
                "(only train and decode settings may change when continuing a run)"
            )


def _sources_at(task: Task[Any, Any, Any], positions: Sequence[int]) -> list[Any]:
    """The sources of the training examples at ``positions`` (ascending), read again."""
    wanted = iter(positions)
    out: list[Any] = []
    target = next(wanted, None)
    for position, ex in enumerate(examples_of(task.read("train"))):
        if target is None:
            break
        if position == target:
            out.append(ex.source)
            target = next(wanted, None)
    if len(out) != len(positions):
        raise UsageError("the training data changed since it was prepared; prepare it again")
    return out


def _source_sampler(codec: Codec[Any, Any, Any], task: Task[Any, Any, Any], train: Pairs,
                    config: RunConfig) -> Callable[[int], list[list[int]]] | None:
    """``train.subword_sampling``: each epoch's training sources, with segmentations the
    codec samples from a seed of the run's seed and the epoch. A sample longer than
    ``train.max_length`` keeps the pair's fixed segmentation."""
    alpha = config.train.subword_sampling
    if not alpha:
        return None
    if not isinstance(codec, SegmentationSampling):
        raise ConfigError("train.subword_sampling", f"the codec of task {config.task!r} cannot sample "
                          "segmentations (it lacks sample_source_tokens)")
    sampler = codec
    sources = _sources_at(task, [int(p) for p in train.kept])

    def resample(epoch: int) -> list[list[int]]:
        seed = (config.seed * 1_000_003 + epoch) % 2**31
        sampled = sampler.sample_source_tokens(sources, alpha, seed)
        out = []
        for tokens, fixed in zip(sampled, train.src, strict=True):
            ids = codec.vocabularies.source.encode(tokens) + [EOS]
            out.append(ids if len(ids) <= config.train.max_length else [int(i) for i in fixed])
        return out

    return resample


def run(config: RunConfig, out: str | Path, *, device: str | torch.device = "auto",
        progress: bool = False) -> dict[str, Metric]:
    """Prepare data, build the vocabulary, train, average checkpoints, decode and score
    the test split. Continues a run already in ``out``. Returns the metrics.

    Started by torchrun (or ``seqtrans run --nproc``), every process calls this with the
    same arguments: it joins the process group, rank 0 prepares the data and the others
    open what it prepared, training is data-parallel, and the test split is decoded by
    all ranks; rank 0 writes the run directory (which all ranks must see)."""
    out = Path(out)
    world = distributed.init(device if isinstance(device, str) else device.type,
                             timeout=config.train.dist_timeout)
    dev_ = distributed.device_of(device if isinstance(device, torch.device) else select_device(device),
                                 world)
    progress = progress and world.main
    task_cls = tasks.load(config.task)
    task = task_cls(config.data)
    _check_resumable(out, config)
    if config.train.tensorboard:
        require_tensorboard()  # before the data is prepared, which may take long
    _seed(config.seed)

    vocab_dir = out / "vocab"
    given = read_assets(vocab_dir) if vocab_dir.is_dir() and any(vocab_dir.iterdir()) else None
    if world.main:
        prepared = prepare(task, config, vocabulary=given, progress=progress)
    # the others use rank 0's vocabulary: found in this node's cache, or prepared again with it
    if world.main:
        distributed.broadcast(prepared.assets)
    else:
        prepared = prepare(task, config, vocabulary=distributed.broadcast(None))
    codec, assets = prepared.codec, prepared.assets
    vocabs = codec.vocabularies
    log.info("vocabulary: %d source / %d target symbols%s", len(vocabs.source), len(vocabs.target),
             " (shared)" if vocabs.shared else "")
    train = Pairs(prepared.dataset.src, prepared.dataset.tgt, prepared.dataset.positions)
    resample = _source_sampler(codec, task, train, config)
    dev_examples = read_split(task, "dev").examples
    dev = encode_pairs(codec, dev_examples, max_length=config.train.max_length,
                       what="dev pairs (dev loss only; all are decoded)")
    log.info("data: %d training pairs, %d dev examples", len(train), len(dev_examples))
    check_sources(config.model, codec, dev_examples[: config.train.valid_max_examples or None])
    model = build_model(config.model, codec)

    # everything the settings ask of the task has been checked: the run directory is written from here
    if world.main:
        for sub in ("checkpoints", "predictions"):
            (out / sub).mkdir(parents=True, exist_ok=True)
        atomic.write_json(out / "config.json", cfg.to_dict(config))
        if not vocab_dir.is_dir() or not any(vocab_dir.iterdir()):
            write_assets(vocab_dir, assets)
    distributed.barrier()
    params = model.num_parameters()
    log.info("model: %s parameters (%.1f M)", f"{params:,}", params / 1e6)

    valid_decode = _valid_decode(config)
    valid_examples = dev_examples[: config.train.valid_max_examples or None]

    def validate(m: Transformer) -> dict[str, float]:
        if not valid_examples:
            return {}
        preds, _ = decode_sources(m, codec, [e.source for e in valid_examples], valid_decode,
                                  device=dev_, spread=True)
        return numeric(task.score(preds, valid_examples)) if world.main else {}  # rank 0's is broadcast

    trainer = Trainer(model, config, train, directory=out / "checkpoints", device=dev_, dev=dev,
                      validate=validate, metric=task_cls.metric, assets=assets,
                      progress_bar=progress, log_file=out / "train.jsonl",
                      tensorboard=out / "tb" if config.train.tensorboard else None,
                      resample=resample)
    result = trainer.fit()

    final = out / "checkpoints" / AVERAGE
    if world.main:
        found = checkpoint.list_checkpoints(out / "checkpoints")[-config.train.average_last :]
        checkpoint.average(found, final)
        log.info("averaged %d checkpoint(s) into %s", len(found), final)
    distributed.barrier()
    model.load_state_dict(checkpoint.load(final)["model"])

    test = read_split(task, "test")
    preds, metrics = score_examples(model, task, codec, test, config.decode, device=dev_, progress=progress)
    if world.main:
        (out / "predictions" / "test.txt").write_text(
            "".join(task.format(p) + "\n" for p in preds), encoding="utf-8")
    metrics.update({
        "params": params,
        "train_tokens_per_s": round(result.tokens_per_second, 1),
        "train_steps": result.progress.step,
        "train_minutes": round(result.progress.seconds / 60, 3),
        "test_sentences": len(test.examples),
    })
    if world.main:
        atomic.write_json(out / "metrics.json", metrics)
    log.info("test: %s", ", ".join(f"{k} {v}" for k, v in metrics.items()))
    distributed.barrier()
    return metrics


def score_examples(model: Transformer | Ensemble, task: Task[Any, Any, Any], codec: Codec[Any, Any, Any],
                   split: Split, decode: DecodeConfig, *, device: torch.device,
                   progress: bool = False) -> tuple[list[Any], dict[str, Metric]]:
    """Decode and score a split: the predictions and the task's metrics, plus
    ``decode_sentences_per_s``, ``skipped`` (the inputs the task left out of the split)
    and, with ``decode.compare_unconstrained``, ``unconstrained_*``. In a process group
    the ranks decode a share each and rank 0's scores are returned on all."""
    examples = split.examples
    for member in members(model):
        check_sources(member.config, codec, examples)
    sources = [e.source for e in examples]
    main = distributed.current().main
    started = time.perf_counter()
    preds, _ = decode_sources(model, codec, sources, decode, device=device, progress=progress,
                              spread=True)
    seconds = time.perf_counter() - started
    metrics = _metrics(task.score(preds, examples)) if main else {}
    metrics["decode_sentences_per_s"] = round(len(examples) / max(seconds, 1e-9), 2)
    metrics["skipped"] = float(sum(split.skipped.values()))
    if decode.compare_unconstrained and decode.constrained and isinstance(codec, Constraining):
        free = dataclasses.replace(decode, constrained=False)
        free_preds, _ = decode_sources(model, codec, sources, free, device=device, spread=True)
        if main:
            free_scores = _metrics(task.score(free_preds, examples))
            metrics.update({f"unconstrained_{k}": v for k, v in free_scores.items()})
    return preds, distributed.broadcast(metrics)


def _metrics(scores: Mapping[str, Metric]) -> dict[str, Metric]:
    """Numbers as floats; strings (signatures) kept as they are."""
    return {k: v if isinstance(v, str) else float(v) for k, v in scores.items()}


def numeric(scores: Mapping[str, Metric]) -> dict[str, float]:
    """The numeric metrics only: what validation and early stopping compare."""
    return {k: float(v) for k, v in scores.items() if not isinstance(v, str)}


def _valid_decode(config: RunConfig) -> DecodeConfig:
    beam = config.train.valid_beam or config.decode.beam
    return cfg.from_dict(DecodeConfig, {**cfg.to_dict(config.decode), "beam": beam,
                                        "nbest": min(config.decode.nbest, beam)})


def find_checkpoint(path: str | Path) -> Path:
    """A checkpoint file, or the final model of a run directory (the average, else the newest)."""
    path = Path(path)
    if path.is_file():
        return path
    for directory in (path / "checkpoints", path):
        if (directory / AVERAGE).is_file():
            return directory / AVERAGE
        found = checkpoint.list_checkpoints(directory)
        if found:
            return found[-1]
    raise CheckpointError(f"{path}: neither a checkpoint file nor a run directory with checkpoints")


def load(path: str | Path, *, overrides: Iterable[str] = (), device: str | torch.device = "auto") -> Loaded:
    """Load a run directory or checkpoint for decoding; ``overrides`` may change the
    ``decode`` (and ``data``) settings, e.g. ``["decode.beam=8"]``."""
    ckpt_path = find_checkpoint(path)
    payload = checkpoint.load(ckpt_path)
    upgrade_checkpoint(payload, origin=ckpt_path)
    saved = payload["config"]
    task_cls = tasks.load(saved["task"])
    tree = cfg.merge(saved, cfg.parse_overrides(overrides, data_cls=task_cls.Config))
    for section in ("model", "task", "seed"):
        if tree.get(section) != saved.get(section):
            raise UsageError(f"--set cannot change '{section}' of a trained model")
    config = cfg.from_dict(RunConfig, tree, data_cls=task_cls.Config)
    task = task_cls(config.data)
    with tempfile.TemporaryDirectory(prefix="seqtrans-assets-") as scratch:
        for name, data in payload.get("assets", {}).items():
            (Path(scratch) / name).write_bytes(data)
        codec = task.load_vocabulary(Path(scratch))  # self-contained: it pickles
    dev_ = device if isinstance(device, torch.device) else select_device(device)
    model = build_model(config.model, codec)
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as exc:
        raise CheckpointError(f"{ckpt_path}: weights do not fit the model of its config: {exc}") from None
    model.to(dev_).eval()
    return Loaded(config, task, codec, model, dev_,
                  vocabulary_digest=assets_digest(payload.get("assets", {})))


def load_ensemble(paths: Sequence[str | Path], *, overrides: Iterable[str] = (),
                  device: str | torch.device = "auto") -> Loaded:
    """Load several runs or checkpoints to decode as one ensemble (one path: as :func:`load`).
    The task, codec and decoding settings (with ``overrides``) are the first run's; every
    run must be of that task and have been trained with the same vocabulary files."""
    if not paths:
        raise UsageError("no run directory or checkpoint given")
    first = load(paths[0], overrides=overrides, device=device)
    for path in paths[1:]:
        other = load(path, device=first.device)
        if other.config.task != first.config.task:
            raise UsageError(f"{paths[0]} and {path} cannot be ensembled: they are models of tasks "
                             f"'{first.config.task}' and '{other.config.task}'")
        if other.vocabulary_digest != first.vocabulary_digest:
            raise UsageError(f"{paths[0]} and {path} cannot be ensembled: they were trained with different "
                             f"vocabularies (sha256 {first.vocabulary_digest[:12]} and "
                             f"{other.vocabulary_digest[:12]}); an ensemble needs one vocabulary")
        first.others.append(other.model)
    return first


def evaluate(path: str | Path | Sequence[str | Path], *, split: str = "test", overrides: Iterable[str] = (),
             device: str | torch.device = "auto", progress: bool = False) -> dict[str, Metric]:
    """Decode and score one split with a trained model, or with an ensemble of several
    (a sequence of paths, see :func:`load_ensemble`)."""
    check_split(split)
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    loaded = load_ensemble(paths, overrides=overrides, device=device)
    _, metrics = score_examples(loaded.searcher, loaded.task, loaded.codec, read_split(loaded.task, split),
                                loaded.config.decode, device=loaded.device, progress=progress)
    return metrics


def average(paths: Sequence[str | Path], out: str | Path) -> Path:
    """Average checkpoints into one model-only checkpoint."""
    return checkpoint.average([Path(p) for p in paths], out)
