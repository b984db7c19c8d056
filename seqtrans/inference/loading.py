"""Loading a trained run for decoding: its task, codec and model, or several runs as an
ensemble; runs saved by earlier versions are converted as they load (:mod:`seqtrans.training.upgrade`).

A run directory holds ``config.json``, ``vocab/`` (the task's files), ``checkpoints/``
(step checkpoints and ``average.pt``), ``predictions/test.txt``, ``metrics.json`` and
``train.jsonl``; a checkpoint alone is enough to decode (it carries the config and the
vocabulary files).
"""

from __future__ import annotations

import logging
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from seqtrans import config as cfg
from seqtrans import tasks
from seqtrans.config import RunConfig
from seqtrans.data.assets import assets_digest
from seqtrans.errors import CheckpointError, UsageError
from seqtrans.inference.evaluation import read_split, score_examples
from seqtrans.inference.loaded import Loaded as Loaded  # where the public API has always named it
from seqtrans.linear.quantize import int8_only
from seqtrans.model.transformer import Transformer, build_model
from seqtrans.runtime.system import release_freed_memory
from seqtrans.shortlist import table as shortlists
from seqtrans.streaming.evaluation import score_stream
from seqtrans.tasks import handover
from seqtrans.tasks.protocol import Metric, bind_languages, check_split
from seqtrans.training import checkpoint
from seqtrans.training.upgrade import upgrade_checkpoint

AVERAGE = "average.pt"

log = logging.getLogger(__name__)


def select_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")
    if name not in ("cpu", "cuda"):
        raise UsageError(f"--device must be auto, cpu or cuda, got {name!r}")
    return torch.device(name)


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
    if not path.exists():
        raise CheckpointError(f"{path}: no such checkpoint file or run directory")
    raise CheckpointError(f"{path}: neither a checkpoint file nor a run directory with checkpoints")


def other_checkpoints(path: str | Path) -> list[Path]:
    """The checkpoint files of the run directory ``path`` is (or lies in) other than
    ``path``: the average and the best first, then the step checkpoints, newest first.
    Only files in torch's format (a zip archive; checked without reading them whole) are
    named, so a truncated or foreign file is not offered in place of another."""
    path = Path(path)
    run = path if path.is_dir() else run_directory(path)
    if not run.is_dir():
        return []
    found: list[Path] = []
    for directory in (run / "checkpoints", run):
        named = [directory / AVERAGE, directory / checkpoint.BEST]
        found += [p for p in named if p.is_file()] + checkpoint.list_checkpoints(directory)[::-1]
    return [p for p in found if p.resolve() != path.resolve() and zipfile.is_zipfile(p)]


def _load_payload(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """The checkpoint ``path`` names (:func:`find_checkpoint`) and its payload; a
    :class:`CheckpointError` that names the run's other checkpoints, which may serve instead."""
    ckpt_path = Path(path)
    try:
        ckpt_path = find_checkpoint(path)
        # a map of the file: the model's tensors are its views, no copy is read (what packing or
        # quantizing for decoding has read, it gives back)
        return ckpt_path, checkpoint.load(ckpt_path, mapped=True)
    except CheckpointError as exc:
        others = other_checkpoints(ckpt_path)
        if not others:
            raise
        raise CheckpointError(f"{exc}; the run's other checkpoints: "
                              + ", ".join(str(p) for p in others)) from None


def load(path: str | Path, *, overrides: Iterable[str] = (), device: str | torch.device = "auto") -> Loaded:
    """Load a run directory or checkpoint for decoding; ``overrides`` may change the
    ``decode`` (and ``data``) settings, e.g. ``["decode.beam=8"]``. With
    ``decode.precision=int8`` (on a CPU) the model is loaded for int8 decoding only
    (:func:`seqtrans.linear.quantize.int8_only`): its float weights are not kept, and decoding
    it in another precision is an error."""
    ckpt_path, payload = _load_payload(path)
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
        codec = handover.load_codec(task, Path(scratch))  # self-contained: it pickles
    codec = bind_languages(codec, source=config.decode.source_lang, target=config.decode.target_lang)
    dev_ = device if isinstance(device, torch.device) else select_device(device)
    with _Unwritten():
        model = build_model(config.model, codec)
    _load_weights(model, payload.pop("model"), ckpt_path)  # the payload no longer holds the weights
    model.to(dev_).eval()
    if config.decode.precision == "int8":
        model = int8_only(model, in_place=True)  # each float weight freed as it is replaced
        release_freed_memory()
    assets = dict(payload.get("assets", {}))
    digest = assets_digest(assets)
    shortlist = None
    if config.decode.shortlist:
        shortlist = shortlists.load(run_directory(ckpt_path) / shortlists.FILE, vocabulary=digest)
    return Loaded(config, task, codec, model, dev_, vocabulary_digest=digest, shortlist=shortlist,
                  assets=assets)


def run_directory(checkpoint_path: Path) -> Path:
    """The run directory a checkpoint file lies in (``RUN/checkpoints/NAME.pt``), or its own
    directory for a checkpoint elsewhere."""
    parent = checkpoint_path.parent
    return parent.parent if parent.name == "checkpoints" else parent


class _Unwritten(TorchFunctionMode):
    """Skips every in-place write to a parameter (its random initialisation) while a model
    is built whose parameters are all then replaced by a checkpoint's (strictly, by
    :func:`_load_weights`): pages of memory never written are never resident, so the
    weights are in memory once, not twice, while they load."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        target = args[0] if args else kwargs.get("tensor")
        name = getattr(func, "__name__", "")
        if isinstance(target, nn.Parameter) and name.endswith("_") and not name.endswith("__"):
            return target
        return func(*args, **kwargs)


def _load_weights(model: Transformer, weights: dict[str, Any], origin: Path) -> None:
    """The checkpoint's tensors become the model's (assigned, not copied; converted where
    the checkpoint stores another dtype than the model's)."""
    own = model.state_dict()
    weights = {k: v.to(own[k].dtype) if k in own and torch.is_tensor(v) else v for k, v in weights.items()}
    try:
        model.load_state_dict(weights, assign=True)
    except RuntimeError as exc:
        built, saved = (sorted({k.split(".")[1] for k in names if k.startswith("extensions.")})
                        for names in (model.state_dict(), weights))
        if built != saved:
            raise CheckpointError(
                f"{origin}: the run's model has the task's model extensions {saved or 'none'}, but its "
                f"settings as given build {built or 'none'}: --set cannot change the data settings that "
                "decide a model's extensions") from None
        raise CheckpointError(f"{origin}: weights do not fit the model of its config: {exc}") from None


def load_ensemble(paths: Sequence[str | Path], *, overrides: Iterable[str] = (),
                  device: str | torch.device = "auto") -> Loaded:
    """Load several runs or checkpoints to decode as one ensemble (one path: as :func:`load`).
    The task, codec and decoding settings are the first run's; ``overrides`` apply to
    every run as it loads (``decode.precision=int8`` loads each member for int8, and a
    setting a member cannot take is refused naming it). Every run must be of the first's
    task and have been trained with the same vocabulary files."""
    if not paths:
        raise UsageError("no run directory or checkpoint given")
    overrides = list(overrides)  # read once per member
    first = load(paths[0], overrides=overrides, device=device)
    for path in paths[1:]:
        other = load(path, overrides=overrides, device=first.device)
        if other.config.task != first.config.task:
            raise UsageError(f"{paths[0]} and {path} cannot be ensembled: they are models of tasks "
                             f"'{first.config.task}' and '{other.config.task}'")
        if other.vocabulary_digest != first.vocabulary_digest:
            raise UsageError(f"{paths[0]} and {path} cannot be ensembled: they were trained with different "
                             f"vocabularies (sha256 {first.vocabulary_digest[:12]} and "
                             f"{other.vocabulary_digest[:12]}); an ensemble needs one vocabulary")
        first.others.append(other.model)
    if len(paths) > 1:  # a glob may match more (or other) checkpoints than meant: say which are used
        log.info("ensemble of %d models, their log-probabilities averaged at each step (task, vocabulary and "
                 "decoding settings of the first): %s", len(paths),
                 ", ".join(str(find_checkpoint(p)) for p in paths))
    return first


def evaluate(path: str | Path | Sequence[str | Path], *, split: str = "test", overrides: Iterable[str] = (),
             device: str | torch.device = "auto", progress: bool = False,
             stream: bool = False, instances: str | Path | None = None) -> dict[str, Metric]:
    """Decode and score one split with a trained model, or with an ensemble of several
    (a sequence of paths, see :func:`load_ensemble`). With ``stream``, one model decodes
    each source as it arrives word by word, and the latency metrics in source words are
    added (:func:`seqtrans.streaming.evaluation.score_stream`); ``instances`` then
    names a file for each sentence's output and delays, in SimulEval's form."""
    check_split(split)
    if instances is not None and not stream:
        raise UsageError("instances are written by a streamed evaluation (stream=True)")
    paths = [path] if isinstance(path, (str, Path)) else list(path)
    loaded = load_ensemble(paths, overrides=overrides, device=device)
    if stream:
        return score_stream(loaded, read_split(loaded.task, split), instances=instances)[1]
    _, metrics = score_examples(loaded.searcher, loaded.task, loaded.codec, read_split(loaded.task, split),
                                loaded.config.decode, device=loaded.device, progress=progress,
                                shortlist=loaded.shortlist)
    return metrics


