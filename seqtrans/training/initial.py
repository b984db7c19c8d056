"""The trained model a run starts from: ``seqtrans run --init`` (its weights, model options
and vocabulary files) and ``--vocab`` (its vocabulary files alone), read from a run
directory or checkpoint. :mod:`seqtrans.pipeline` takes them into a run."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from seqtrans import config as cfg
from seqtrans.attention import StartsFromScaledDot
from seqtrans.config import RunConfig
from seqtrans.errors import UsageError
from seqtrans.inference.loading import find_checkpoint
from seqtrans.model.transformer import Transformer
from seqtrans.tasks import handover
from seqtrans.training import checkpoint
from seqtrans.training.upgrade import upgrade_checkpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Initial:
    """A trained model that a run starts from (``seqtrans run --init``): its task, model
    options, vocabulary files and weights, and its task's data settings."""

    path: Path
    task: str
    model: dict[str, Any]  # the saved model section
    assets: dict[str, bytes]
    weights: dict[str, torch.Tensor]
    data: dict[str, Any] = field(default_factory=dict)  # the saved data section

    def assets_for(self, task: str) -> dict[str, bytes]:
        """The vocabulary files a run of ``task`` takes from this model: its own, and for a
        run of another task the record that sees them through that task's text form
        (:mod:`seqtrans.tasks.handover`)."""
        if task == self.task:
            return self.assets
        return handover.files(self.assets, model_task=self.task, model_data=self.data)


def initial(path: str | Path) -> Initial:
    """The model of a run directory or checkpoint to start a run from."""
    found = find_checkpoint(path)
    payload = checkpoint.load(found)
    upgrade_checkpoint(payload, origin=found)
    saved = payload["config"]
    return Initial(found, saved["task"], dict(saved["model"]), dict(payload.get("assets", {})),
                   payload["model"], dict(saved.get("data") or {}))


def vocabulary_of(path: str | Path, config: RunConfig) -> Initial:
    """The trained model whose vocabulary files a run of ``config`` takes instead of building
    its own (``seqtrans run --vocab``, a distilled student its teacher's): a
    :class:`UsageError` naming both tasks when it is a model of another task."""
    given = initial(path)
    if given.task != config.task:
        raise UsageError(f"--vocab {given.path}: the vocabulary of a model of task '{given.task}', but this "
                         f"run's config is of task '{config.task}'")
    return given


def with_initial_model(config: RunConfig, init: Initial, overrides: Sequence[str] = ()) -> RunConfig:
    """``config`` with the model options of ``init`` (its shape decides the weights),
    where the ``model.*`` keys of ``overrides`` (dropout, say) still apply. A model of
    another task keeps its codec, seen through the text form of both tasks
    (:mod:`seqtrans.tasks.handover`)."""
    if init.task != config.task:
        missing = handover.problems(config.task, init.task)
        if missing:
            raise UsageError(f"--init {init.path}: a model of task '{init.task}', not '{config.task}'; a run "
                             f"keeps another task's model only where both read and write text: "
                             f"{'; '.join(missing)}")
    model_pairs = [pair for pair in overrides if pair.strip().startswith("model.")]
    given = cfg.parse_overrides(model_pairs, data_cls=None).get("model", {})
    tree = cfg.merge(cfg.to_dict(config), {"model": cfg.merge(init.model, given)})
    return cfg.from_dict(RunConfig, tree, data_cls=type(config.data) if config.data is not None else None)


def start_from(model: Transformer, init: Initial) -> None:
    """Load ``init``'s weights; with another encoder-decoder attention than ``init``'s
    scaled-dot one, every other weight, and what each new attention adopts of the old
    (:class:`~seqtrans.attention.StartsFromScaledDot`; the rest of it starts new)."""
    before = init.model.get("cross_attention", "scaled_dot")
    after = model.config.cross_attention
    if before == after:
        try:
            model.load_state_dict(init.weights)
        except RuntimeError as exc:
            raise UsageError(f"--init {init.path}: its weights do not fit this run's model: {exc}") from None
        log.info("starting from the weights of %s", init.path)
        return
    if before != "scaled_dot":
        raise UsageError(f"--init {init.path}: a model with model.cross_attention={before} can start "
                         f"only a run of the same attention, not {after} (a scaled-dot model can start any)")
    prefixes = [f"decoder.{i}.cross_attn." for i in range(len(model.decoder_layers))]
    rest = {k: v for k, v in init.weights.items() if not k.startswith(tuple(prefixes))}
    try:
        missing, unexpected = model.load_state_dict(rest, strict=False)
    except RuntimeError as exc:
        raise UsageError(f"--init {init.path}: its weights do not fit this run's model: {exc}") from None
    stray = [k for k in [*missing, *unexpected] if not k.startswith(tuple(prefixes))]
    if stray:
        raise UsageError(f"--init {init.path}: its weights do not fit this run's model: "
                         f"{', '.join(stray[:5])}")
    adopted = 0
    for prefix, layer in zip(prefixes, model.decoder_layers):
        attn = layer.cross_attn
        if isinstance(attn, StartsFromScaledDot):
            old = {k[len(prefix):]: v for k, v in init.weights.items() if k.startswith(prefix)}
            adopted += len(attn.adopt(old))
    log.info("starting from the weights of %s; encoder-decoder attention %s -> %s: %d of its tensors taken "
             "from the old attention, the rest new", init.path, before, after, adopted)
