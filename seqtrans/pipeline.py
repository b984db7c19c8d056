"""Training orchestration, as functions: ``run`` (prepare, train, average, decode and
score the test split) and ``average``. Loading, decoding and scoring a trained run are in
:mod:`seqtrans.inference`, which this module uses and which never uses it.

A run directory holds ``config.json``, ``vocab/`` (the task's files),
``checkpoints/`` (step checkpoints, ``average.pt`` and ``best.pt``), ``predictions/test.txt``,
``metrics.json``, ``train.jsonl`` (log records) and ``run.log`` (the log); ``seqtrans run``
writes the same files, through :func:`run`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from seqtrans import _moved, tasks
from seqtrans import config as cfg
from seqtrans.config import DecodeConfig, RunConfig
from seqtrans.data.assets import assets_digest, read_assets, write_assets
from seqtrans.data.batches import Pairs, check_sources, encode_pairs
from seqtrans.data.vocab import EOS
from seqtrans.errors import CheckpointError, ConfigError, UsageError
from seqtrans.inference.evaluation import decode_sources, numeric, read_split, score_examples
from seqtrans.inference.loading import AVERAGE, select_device
from seqtrans.model.transformer import Transformer, build_model
from seqtrans.prepare import examples_of, prepare
from seqtrans.runtime import atomic
from seqtrans.shortlist import table as shortlists
from seqtrans.tasks.protocol import Codec, Example, Metric, SegmentationSampling, Task, metric_mode
from seqtrans.training import checkpoint, distributed, runlog
from seqtrans.training import initial as initial_model
from seqtrans.training.initial import Initial
from seqtrans.training.loop import Trainer
from seqtrans.training.tracking import require_tensorboard
from seqtrans.training.upgrade import check_current

log = logging.getLogger(__name__)


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


@dataclass
class _Data:
    """What training reads: the codec and its vocabulary files, the training pairs (with the
    sampler of their segmentations), and the dev examples."""

    codec: Codec[Any, Any, Any]
    assets: dict[str, bytes]
    train: Pairs
    resample: Callable[[int], list[list[int]]] | None
    dev_examples: list[Example[Any, Any]]
    dev: Pairs


def default_directory(task: str) -> Path:
    """The run directory of a run not given one: ``runs/TASK-YYYYMMDD-HHMMSS``."""
    return Path("runs") / f"{task}-{time.strftime('%Y%m%d-%H%M%S')}"


def run(config: RunConfig, out: str | Path, *, device: str | torch.device = "auto",
        progress: bool = False, init: Initial | None = None,
        vocabulary: Initial | None = None) -> dict[str, Metric]:
    """Prepare data, build the vocabulary, train, average checkpoints, decode and score
    the test split. Continues a run already in ``out``. Returns the metrics. Writes
    ``out/run.log``: every log record of the run that the process's logging lets through,
    or, where logging is not configured, those of level INFO and above
    (:func:`seqtrans.training.runlog.to_file`). A run refused for its settings or its
    data before it writes ``out`` leaves nothing there.

    With ``init`` (:func:`seqtrans.initial`, its model options already in ``config``:
    :func:`seqtrans.with_initial_model`), training starts from its weights and its
    vocabulary instead of building one, as ``seqtrans run --init`` does; with ``vocabulary``
    (:func:`seqtrans.vocabulary_of`), from new weights with that model's vocabulary
    (``--vocab``). Giving both is a :class:`~seqtrans.errors.UsageError`.

    Started by torchrun (or ``seqtrans run --nproc``), every process calls this with the
    same arguments: it joins the process group (and leaves it at the end), rank 0's
    ``out`` is every rank's (ranks started at different seconds name
    :func:`default_directory` differently), rank 0 prepares the data and the others open
    what it prepared, training is data-parallel, and the test split is decoded by all
    ranks; rank 0 writes the run directory (which all ranks must see). A collective that
    fails because another rank is gone or late raises a
    :class:`~seqtrans.errors.SeqtransError` that says so."""
    if init is not None and vocabulary is not None:
        raise UsageError("init (--init) brings its model's vocabulary; give init or vocabulary (--vocab), "
                         "not both")
    joined = not distributed.current().distributed
    world = distributed.init(device if isinstance(device, str) else device.type,
                             timeout=config.train.dist_timeout)
    try:
        out = distributed.broadcast(Path(out))
        with contextlib.ExitStack() as logged:
            run_log = None
            if world.main:
                run_log = logged.enter_context(runlog.to_file(out / "run.log"))
                log.info("run directory: %s", out)
            try:
                return _train_and_test(config, out, world, device=device, progress=progress and world.main,
                                       init=init, vocabulary=vocabulary, run_log=run_log)
            except RuntimeError as exc:
                lost = distributed.lost_contact(exc, timeout=config.train.dist_timeout)
                if not world.distributed or lost is None:
                    raise
                raise lost from None
    finally:
        if joined:
            distributed.shutdown()


def _train_and_test(config: RunConfig, out: Path, world: distributed.World, *, device: str | torch.device,
                    progress: bool, init: Initial | None, vocabulary: Initial | None,
                    run_log: runlog.RunLogFile | None) -> dict[str, Metric]:
    """:func:`run`'s work, in this process's part of the group (``run_log`` on rank 0)."""
    dev_ = distributed.device_of(device if isinstance(device, torch.device) else select_device(device),
                                 world)
    task_cls = tasks.load(config.task)
    task = task_cls(config.data)
    _check_resumable(out, config)
    if config.train.tensorboard:
        require_tensorboard()  # before the data is prepared, which may take long
    _seed(config.seed)
    source = init if init is not None else vocabulary
    data = _data(task, config, out / "vocab", world, progress=progress, given=source)
    check_sources(config.model, data.codec, data.dev_examples[: config.train.valid_max_examples or None])
    model = build_model(config.model, data.codec)
    if init is not None:
        initial_model.start_from(model, init)
    # everything the settings ask of the task has been checked: the run directory is written from here
    if run_log is not None:
        _start_run_directory(out, config, data.assets, run_log)
    distributed.barrier()
    params = model.num_parameters()
    log.info("model: %s parameters (%.1f M)", f"{params:,}", params / 1e6)
    trainer = Trainer(model, config, data.train, directory=out / "checkpoints", device=dev_, dev=data.dev,
                      validate=_validator(task, data, config, device=dev_), metric=task_cls.metric,
                      metric_mode=metric_mode(task_cls),
                      assets=data.assets, progress_bar=progress, log_file=out / "train.jsonl",
                      tensorboard=out / "tb" if config.train.tensorboard else None, resample=data.resample)
    result = trainer.fit()
    _load_average(model, out / "checkpoints", config.train.average_last)
    shortlist = _shortlist(out, data) if config.decode.shortlist else None
    metrics, sentences = _test(model, task, data.codec, config, out, device=dev_, progress=progress,
                               shortlist=shortlist)
    metrics.update({
        "params": params,
        "train_tokens_per_s": round(result.tokens_per_second, 1),
        "train_steps": result.progress.step,
        "train_minutes": round(result.progress.seconds / 60, 3),
        "test_sentences": sentences,
    })
    if world.main:
        atomic.write_json(out / "metrics.json", metrics)
    log.info("test: %s", ", ".join(f"{k} {v}" for k, v in metrics.items()))
    distributed.barrier()
    return metrics


def _data(task: Task[Any, Any, Any], config: RunConfig, vocab_dir: Path, world: distributed.World, *,
          progress: bool, given: Initial | None = None) -> _Data:
    """The training data prepared (by rank 0; the others open what it prepared, or prepare
    it again with its vocabulary), and the dev examples. The vocabulary is the run
    directory's when it has one (the same files as ``given``'s, when given), else
    ``given``'s, else built."""
    assets = given.assets_for(config.task) if given is not None else None
    if vocab_dir.is_dir() and any(vocab_dir.iterdir()):
        own = read_assets(vocab_dir)
        if given is not None and assets is not None and assets_digest(own) != assets_digest(assets):
            raise UsageError(f"{given.path} has other vocabulary files (sha256 "
                             f"{assets_digest(assets)[:12]}) than the run being continued in "
                             f"{vocab_dir} (sha256 {assets_digest(own)[:12]}); choose a new --out")
        assets = own
    if world.main:
        prepared = prepare(task, config, vocabulary=assets, progress=progress)
        distributed.broadcast(prepared.assets)
    else:
        prepared = prepare(task, config, vocabulary=distributed.broadcast(None))
    codec = prepared.codec
    vocabs = codec.vocabularies
    log.info("vocabulary: %d source / %d target symbols%s", len(vocabs.source), len(vocabs.target),
             " (shared)" if vocabs.shared else "")
    train = Pairs(prepared.dataset.src, prepared.dataset.tgt, prepared.dataset.positions)
    dev_examples = read_split(task, "dev").examples
    dev = encode_pairs(codec, dev_examples, max_length=config.train.max_length,
                       what="dev pairs (dev loss only; all are decoded)")
    log.info("data: %d training pairs, %d dev examples", len(train), len(dev_examples))
    return _Data(codec, dict(prepared.assets), train, _source_sampler(codec, task, train, config),
                 dev_examples, dev)


def _start_run_directory(out: Path, config: RunConfig, assets: dict[str, bytes],
                         run_log: runlog.RunLogFile) -> None:
    for sub in ("checkpoints", "predictions"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    run_log.open()
    atomic.write_json(out / "config.json", cfg.to_dict(config))
    vocab_dir = out / "vocab"
    if not vocab_dir.is_dir() or not any(vocab_dir.iterdir()):
        write_assets(vocab_dir, assets)


def _validator(task: Task[Any, Any, Any], data: _Data, config: RunConfig, *,
               device: torch.device) -> Callable[[Transformer], dict[str, float]]:
    """Validation: the task's metrics of the first ``train.valid_max_examples`` dev examples
    decoded with ``train.valid_beam``, by every rank (rank 0's are broadcast)."""
    decode = _valid_decode(config)
    examples = data.dev_examples[: config.train.valid_max_examples or None]

    def validate(model: Transformer) -> dict[str, float]:
        if not examples:
            return {}
        preds, _ = decode_sources(model, data.codec, [e.source for e in examples], decode, device=device,
                                  spread=True)
        return numeric(task.score(preds, examples)) if distributed.current().main else {}

    return validate


def _load_average(model: Transformer, directory: Path, last: int) -> None:
    """Average the last ``last`` checkpoints into ``average.pt`` (rank 0) and load it."""
    final = directory / AVERAGE
    if distributed.current().main:
        found = checkpoint.list_checkpoints(directory)[-last:]
        checkpoint.average(found, final)
        log.info("averaged %d checkpoint(s) into %s", len(found), final)
    distributed.barrier()
    model.load_state_dict(checkpoint.load(final)["model"])


def _shortlist(out: Path, data: _Data) -> shortlists.Shortlist:
    """The run's vocabulary shortlist (``decode.shortlist``): the one in ``out`` when it was
    built for this vocabulary, else built from the training pairs (by rank 0) and written there."""
    path, digest = out / shortlists.FILE, assets_digest(data.assets)
    if distributed.current().main:
        try:
            shortlists.load(path, vocabulary=digest)
        except CheckpointError:
            vocabs = data.codec.vocabularies
            shortlists.build(data.train.src, data.train.tgt, source_size=len(vocabs.source),
                             target_size=len(vocabs.target), vocabulary=digest).save(path)
            log.info("shortlist: written to %s", path)
    distributed.barrier()
    return shortlists.load(path, vocabulary=digest)


def _test(model: Transformer, task: Task[Any, Any, Any], codec: Codec[Any, Any, Any], config: RunConfig,
          out: Path, *, device: torch.device, progress: bool,
          shortlist: shortlists.Shortlist | None = None) -> tuple[dict[str, Metric], int]:
    """Decode and score the test split: its metrics and size; rank 0 writes the predictions."""
    test = read_split(task, "test")
    preds, metrics = score_examples(model, task, codec, test, config.decode, device=device, progress=progress,
                                    shortlist=shortlist)
    if distributed.current().main:
        (out / "predictions" / "test.txt").write_text(
            "".join(task.format(p) + "\n" for p in preds), encoding="utf-8")
    return metrics, len(test.examples)


def _valid_decode(config: RunConfig) -> DecodeConfig:
    beam = config.train.valid_beam or config.decode.beam
    # the shortlist is built from the training data once training is over
    return cfg.from_dict(DecodeConfig, {**cfg.to_dict(config.decode), "beam": beam,
                                        "nbest": min(config.decode.nbest, beam), "shortlist": False})


def average(paths: Sequence[str | Path], out: str | Path) -> Path:
    """Average checkpoints into one model-only checkpoint."""
    return checkpoint.average([Path(p) for p in paths], out)


def __getattr__(name: str) -> Any:
    # their one path is seqtrans's; these warn until 0.3
    if name == "resolve_config":
        from seqtrans.tasks.configuration import resolve_config

        return _moved.old_path(__name__, name, resolve_config)
    if name in ("initial", "with_initial_model", "vocabulary_of"):
        return _moved.old_path(__name__, name, getattr(initial_model, name))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
