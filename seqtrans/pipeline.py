"""The operations behind the CLI, as functions: run, evaluate, predict, average.

A run directory holds ``config.json``, ``vocab/`` (the task's files),
``checkpoints/`` (step checkpoints and ``average.pt``), ``predictions/test.txt``,
``metrics.json`` and ``train.jsonl`` (log records).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from seqtrans import config as cfg
from seqtrans import tasks
from seqtrans.config import DecodeConfig, RunConfig
from seqtrans.data import Pairs, encode_pairs
from seqtrans.decoding import Hypothesis, generate
from seqtrans.errors import CheckpointError, ConfigError, DataError, UsageError
from seqtrans.model import Transformer, build_model
from seqtrans.tasks.protocol import Example, Metric, Task
from seqtrans.training import checkpoint
from seqtrans.training.loop import Trainer
from seqtrans.vocab import EOS, Vocabularies

log = logging.getLogger(__name__)

AVERAGE = "average.pt"


def resolve_config(task: str, *, preset: str | None = None, config_file: str | Path | None = None,
                   overrides: Iterable[str] = ()) -> RunConfig:
    """The fully resolved configuration of a run of ``task`` (see :mod:`seqtrans.config`)."""
    task_cls = tasks.load(task)
    return cfg.resolve(task, data_cls=task_cls.Config, task_defaults=task_cls.defaults,
                       task_presets=task_cls.presets, preset=preset, config_file=config_file,
                       overrides=overrides)


def select_device(name: str = "auto") -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")
    if name not in ("cpu", "cuda"):
        raise UsageError(f"--device must be auto, cpu or cuda, got {name!r}")
    return torch.device(name)


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _read_assets(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@dataclass
class Loaded:
    """A trained model with its task and vocabularies, ready to decode."""

    config: RunConfig
    task: Task
    vocabs: Vocabularies
    model: Transformer
    device: torch.device
    _assets_dir: Any = field(default=None, repr=False)  # keeps a temporary directory alive

    def decode(self, sources: Sequence[Any], *, decode: DecodeConfig | None = None,
               progress: bool = False) -> tuple[list[Any], list[list[Hypothesis]]]:
        """Predictions (task objects) and the n-best hypotheses of ``sources``, in order."""
        return decode_sources(self.model, self.task, self.vocabs, sources,
                              decode or self.config.decode, device=self.device, progress=progress)


def decode_sources(model: Transformer, task: Task, vocabs: Vocabularies, sources: Sequence[Any],
                   decode: DecodeConfig, *, device: torch.device,
                   progress: bool = False) -> tuple[list[Any], list[list[Hypothesis]]]:
    ids = [vocabs.source.encode(task.source_tokens(s)) + [EOS] for s in sources]
    limit = model.config.max_positions - 1 if model.config.positions == "learned" else None

    def constraints(idx: list[int]) -> Any:
        return task.constraint([sources[i] for i in idx], vocabs)

    hyps = generate(model, ids, decode, device=device, constraints=constraints,
                    position_limit=limit, progress=progress)
    preds = [task.prediction(vocabs.target.decode(h[0].tokens) if h else [], s)
             for h, s in zip(hyps, sources)]
    return preds, hyps


def _seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def _check_resumable(out: Path, config: RunConfig) -> None:
    saved_path = out / "config.json"
    if not saved_path.exists():
        return
    saved = json.loads(saved_path.read_text(encoding="utf-8"))
    new = cfg.to_dict(config)
    for key in ("task", "seed", "model", "data"):
        if saved.get(key) != new.get(key):
            raise UsageError(
                f"{out} holds a run with different '{key}' settings; choose a new --out "
                "(only train and decode settings may change when continuing a run)"
            )


def _source_sampler(task: Task, vocabs: Vocabularies, examples: Sequence[Example], train: Pairs,
                    config: RunConfig) -> Callable[[int], list[list[int]]] | None:
    """``train.subword_sampling``: each epoch's training sources, with segmentations the
    task samples from a seed of the run's seed and the epoch. A sample longer than
    ``train.max_length`` keeps the pair's fixed segmentation."""
    alpha = config.train.subword_sampling
    if not alpha:
        return None
    sources = [examples[i].source for i in train.kept]

    def resample(epoch: int) -> list[list[int]]:
        seed = (config.seed * 1_000_003 + epoch) % 2**31
        sampled = task.sample_source_tokens(sources, alpha, seed)  # type: ignore[attr-defined]
        out = []
        for tokens, fixed in zip(sampled, train.src, strict=True):
            ids = vocabs.source.encode(tokens) + [EOS]
            out.append(ids if len(ids) <= config.train.max_length else fixed)
        return out

    return resample


def run(config: RunConfig, out: str | Path, *, device: str | torch.device = "auto",
        progress: bool = False) -> dict[str, Metric]:
    """Prepare data, build the vocabulary, train, average checkpoints, decode and score
    the test split. Continues a run already in ``out``. Returns the metrics."""
    out = Path(out)
    dev_ = device if isinstance(device, torch.device) else select_device(device)
    task: Task = tasks.load(config.task)(config.data)
    if config.train.subword_sampling and not hasattr(task, "sample_source_tokens"):
        raise ConfigError("train.subword_sampling",
                              f"task {config.task!r} cannot sample segmentations (no sample_source_tokens)")
    _check_resumable(out, config)
    for sub in ("checkpoints", "predictions"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    _write_json(out / "config.json", cfg.to_dict(config))
    _seed(config.seed)

    train_examples = list(task.read("train"))
    vocab_dir = out / "vocab"
    if vocab_dir.is_dir() and any(vocab_dir.iterdir()):
        vocabs = task.vocabulary(vocab_dir, None)
    else:
        vocab_dir.mkdir(exist_ok=True)
        vocabs = task.vocabulary(vocab_dir, train_examples)
    log.info("vocabulary: %d source / %d target symbols%s", len(vocabs.source), len(vocabs.target),
             " (shared)" if vocabs.shared else "")
    train = encode_pairs(task, vocabs, train_examples, max_length=config.train.max_length,
                         what="training pairs")
    dev_examples = list(task.read("dev"))
    dev = encode_pairs(task, vocabs, dev_examples, max_length=config.train.max_length,
                       what="dev pairs (dev loss only; all are decoded)")
    log.info("data: %d training pairs, %d dev examples", len(train), len(dev_examples))

    model = build_model(config.model, vocabs)
    params = model.num_parameters()
    log.info("model: %s parameters (%.1f M)", f"{params:,}", params / 1e6)

    valid_decode = _valid_decode(config)
    valid_examples = dev_examples[: config.train.valid_max_examples or None]

    def validate(m: Transformer) -> dict[str, float]:
        if not valid_examples:
            return {}
        preds, _ = decode_sources(m, task, vocabs, [e.source for e in valid_examples], valid_decode,
                                  device=dev_)
        return numeric(task.score(preds, valid_examples))

    trainer = Trainer(model, config, train, directory=out / "checkpoints", device=dev_, dev=dev,
                      validate=validate, metric=task.metric, assets=_read_assets(vocab_dir),
                      progress_bar=progress, log_file=out / "train.jsonl",
                      resample=_source_sampler(task, vocabs, train_examples, train, config))
    result = trainer.fit()

    found = checkpoint.list_checkpoints(out / "checkpoints")[-config.train.average_last :]
    final = checkpoint.average(found, out / "checkpoints" / AVERAGE)
    log.info("averaged %d checkpoint(s) into %s", len(found), final)
    model.load_state_dict(checkpoint.load(final)["model"])

    test_examples = list(task.read("test"))
    preds, metrics = score_examples(model, task, vocabs, test_examples, config.decode, device=dev_,
                                    progress=progress)
    (out / "predictions" / "test.txt").write_text(
        "".join(task.format(p) + "\n" for p in preds), encoding="utf-8")
    metrics.update({
        "params": params,
        "train_tokens_per_s": round(result.tokens_per_second, 1),
        "train_steps": result.progress.step,
        "train_minutes": round(result.progress.seconds / 60, 3),
        "test_sentences": len(test_examples),
    })
    _write_json(out / "metrics.json", metrics)
    log.info("test: %s", ", ".join(f"{k} {v}" for k, v in metrics.items()))
    return metrics


def score_examples(model: Transformer, task: Task, vocabs: Vocabularies, examples: Sequence[Example],
                   decode: DecodeConfig, *, device: torch.device,
                   progress: bool = False) -> tuple[list[Any], dict[str, Metric]]:
    """Decode and score ``examples``: the predictions and the task's metrics, plus
    ``decode_sentences_per_s`` (and ``unconstrained_*`` with ``decode.compare_unconstrained``)."""
    sources = [e.source for e in examples]
    started = time.perf_counter()
    preds, _ = decode_sources(model, task, vocabs, sources, decode, device=device, progress=progress)
    seconds = time.perf_counter() - started
    metrics = _metrics(task.score(preds, examples))
    metrics["decode_sentences_per_s"] = round(len(examples) / max(seconds, 1e-9), 2)
    if decode.compare_unconstrained and decode.constrained:
        free = dataclasses.replace(decode, constrained=False)
        free_preds, _ = decode_sources(model, task, vocabs, sources, free, device=device)
        free_scores = _metrics(task.score(free_preds, examples))
        metrics.update({f"unconstrained_{k}": v for k, v in free_scores.items()})
    return preds, metrics


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
    saved = payload["config"]
    task_cls = tasks.load(saved["task"])
    tree = cfg.merge(saved, cfg.parse_overrides(overrides, data_cls=task_cls.Config))
    for section in ("model", "task", "seed"):
        if tree.get(section) != saved.get(section):
            raise UsageError(f"--set cannot change '{section}' of a trained model")
    config = cfg.from_dict(RunConfig, tree, data_cls=task_cls.Config)
    task = task_cls(config.data)
    holder = tempfile.TemporaryDirectory(prefix="seqtrans-assets-")
    for name, data in payload.get("assets", {}).items():
        (Path(holder.name) / name).write_bytes(data)
    vocabs = task.vocabulary(Path(holder.name), None)
    dev_ = device if isinstance(device, torch.device) else select_device(device)
    model = build_model(config.model, vocabs)
    try:
        model.load_state_dict(payload["model"])
    except RuntimeError as exc:
        raise CheckpointError(f"{ckpt_path}: weights do not fit the model of its config: {exc}") from None
    model.to(dev_).eval()
    return Loaded(config, task, vocabs, model, dev_, holder)


def evaluate(path: str | Path, *, split: str = "test", overrides: Iterable[str] = (),
             device: str | torch.device = "auto", progress: bool = False) -> dict[str, Metric]:
    """Decode and score one split with a trained model."""
    if split not in tasks.SPLITS:
        raise UsageError(f"unknown split '{split}'; choose one of {', '.join(tasks.SPLITS)}")
    loaded = load(path, overrides=overrides, device=device)
    examples: list[Example] = list(loaded.task.read(split))
    _, metrics = score_examples(loaded.model, loaded.task, loaded.vocabs, examples, loaded.config.decode,
                                device=loaded.device, progress=progress)
    return metrics


def predict(loaded: Loaded, lines: Iterable[str]) -> Iterator[str]:
    """One output per input line, as each is decoded. With ``decode.nbest`` > 1, each
    input gives ``nbest`` lines ``rank<TAB>score<TAB>output`` and an empty line."""
    nbest = loaded.config.decode.nbest
    for line in lines:
        source = loaded.task.parse_source(line.rstrip("\n"))
        preds, hyps = loaded.decode([source])
        if nbest == 1:
            yield loaded.task.format(preds[0])
            continue
        for rank, hyp in enumerate(hyps[0], 1):
            pred = loaded.task.prediction(loaded.vocabs.target.decode(hyp.tokens), source)
            yield f"{rank}\t{hyp.score:.4f}\t{loaded.task.format(pred)}"
        yield ""


def stream(loaded: Loaded, words: Iterable[str | None], write: Callable[[str], None]) -> None:
    """Simultaneous decoding of inputs that arrive word by word (see
    :mod:`seqtrans.decoding.streaming`).

    ``words`` yields each input's words as they arrive and ``None`` where an input line
    ends; it is pulled only as far as decoding needs. Each target token is passed to
    ``write`` as soon as it is decided (the model's target tokens, space-separated); when
    an input's output is complete, a tab, the delays (the source tokens read when each
    token was written) and a line break follow, and the rest of that input is skipped as
    it arrives. The average proportion and average lagging are logged at the end.

    The task's tokenisation is applied to the words arrived so far and the new tokens
    are fed to the model; the tokens of a line's first n words must be a prefix of
    those of its first n + 1 (true of whitespace tokens and of sentencepiece), else
    :class:`DataError`.
    """
    from seqtrans.decoding.streaming import (
        average_lagging,
        average_proportion,
        check_streamable,
        stream_greedy,
    )

    check_streamable(loaded.model.config)
    if loaded.config.decode.nbest > 1:
        raise UsageError("streaming decodes greedily: decode.nbest must be 1")
    model, task, vocabs = loaded.model, loaded.task, loaded.vocabs
    limit = model.config.max_positions - 1 if model.config.positions == "learned" else None
    events = iter(words)
    proportions, laggings = [], []
    line_number = 0

    def ids_of(words_so_far: list[str]) -> list[int]:
        return vocabs.source.encode(task.source_tokens(task.parse_source(" ".join(words_so_far))))

    def source(word: str | None, arrived: list[str]) -> Iterator[int]:
        """The ids of a line's words as they arrive, ending with the line."""
        fed: list[int] = []
        while word is not None:
            arrived.append(word)
            ids = ids_of(arrived)
            if ids[: len(fed)] != fed:
                raise DataError("<stdin>", line_number,
                                "the task's tokens of the words read so far are not a prefix of those "
                                "of more words: this task cannot be streamed word by word")
            yield from ids[len(fed):]
            fed = ids
            word = next(events, None)
        arrived.append("")  # marks the end of the line as read

    for first in events:
        line_number += 1
        arrived: list[str] = []
        delays: list[int] = []
        for emission in stream_greedy(model, source(first, arrived), loaded.config.decode,
                                      position_limit=limit):
            write((" " if delays else "") + " ".join(vocabs.target.decode([emission.token])))
            delays.append(emission.delay)
        write("\t" + " ".join(map(str, delays)) + "\n")
        if first is not None and arrived[-1:] != [""]:
            # the output is complete before the input: the rest of the line is not needed
            while (word := next(events, None)) is not None:
                arrived.append(word)
        length = len(ids_of([w for w in arrived if w]))
        if delays and length:
            proportions.append(average_proportion(delays, length))
            laggings.append(average_lagging(delays, length))
    if proportions:
        log.info("streamed %d inputs: average proportion %.3f, average lagging %.2f source tokens",
                 len(proportions), sum(proportions) / len(proportions), sum(laggings) / len(laggings))


def words_of(chunks: Iterable[str]) -> Iterator[str | None]:
    """The words of text arriving in chunks, each as soon as the whitespace after it has
    arrived, and ``None`` at each line break (and at the end of an unterminated last line)."""
    word: list[str] = []
    pending_line = False
    for chunk in chunks:
        for ch in chunk:
            if ch.isspace():
                if word:
                    yield "".join(word)
                    word = []
                    pending_line = True
                if ch == "\n":
                    yield None
                    pending_line = False
            else:
                word.append(ch)
                pending_line = True
    if word:
        yield "".join(word)
    if pending_line:
        yield None


def average(paths: Sequence[str | Path], out: str | Path) -> Path:
    """Average checkpoints into one model-only checkpoint."""
    return checkpoint.average([Path(p) for p in paths], out)
