"""The ``train`` section: optimisation, batching, validation and checkpoints (paper,
section 5), each option with its default and help."""

from __future__ import annotations

import math
from dataclasses import dataclass

from seqtrans.config.fields import check_at_least, check_precision, option
from seqtrans.errors import ConfigError

#: Values of ``train.precision``.
TRAIN_PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@dataclass(frozen=True)
class TrainConfig:
    """Optimisation, batching, validation and checkpoints (paper, section 5)."""

    max_tokens: int = option(
        25000, "Batch size: about this many source and this many target tokens, padding included."
    )
    accumulate: int = option(1, "Batches whose gradients are summed into one update.")
    lr_scale: float = option(
        1.0, "Scale factor on lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)."
    )
    warmup: int = option(4000, "warmup_steps of the learning-rate schedule.")
    cooldown: float = option(
        0.0, "Fraction of the budget (train.max_steps, or train.max_minutes if that runs out first) at "
        "its end over which the learning rate falls linearly to 0; 0 keeps the paper's schedule."
    )
    adam_betas: tuple[float, float] = option((0.9, 0.98), "Adam beta1, beta2.")
    adam_eps: float = option(1e-9, "Adam epsilon.")
    label_smoothing: float = option(0.1, "epsilon_ls of label-smoothed cross-entropy.")
    latency_weight: float = option(
        0.0, "lambda of the latency loss of a learned read policy (model.cross_attention=monotonic; milk, "
        "Arivazhagan et al. 2019; mocha, with MILk's loss; mma_hard, mma_il and mma_chunk, Ma et al. 2020's "
        "lambda_avg): lambda times each sentence's differentiable average lagging under the expected "
        "alignments, in source positions (per layer, its monotonic heads' delays combined by a "
        "softmax-weighted average), averaged over the decoder layers, is added to the loss. Finite, 0 or "
        "more."
    )
    latency_weight_var: float = option(
        0.0, "lambda_var of monotonic multihead attention (model.cross_attention=mma_hard, mma_il or "
        "mma_chunk; Ma et al. 2020): lambda_var times each sentence's variance of the expected delays over "
        "every monotonic head of every decoder layer, averaged over its target positions, is added to the "
        "loss, so that the heads agree on when to write. Finite, 0 or more."
    )
    subword_sampling: float = option(
        0.0, "Subword regularization (Kudo 2018): every epoch, re-encode the training sources with "
        "segmentations sampled from the task's unigram model at this smoothing alpha (smaller: more "
        "varied); 0 keeps one segmentation. Needs a task whose codec samples segmentations "
        "(SegmentationSampling)."
    )
    clip_norm: float = option(0.0, "Clip the gradient norm to this value; 0 disables clipping.")
    max_skipped: int = option(
        5, "Updates that cannot be made (a loss or gradient that is not finite; on one GPU, a batch "
        "that does not fit in memory even split in 8) are skipped with a warning naming them; after "
        "this many in a row the run stops, naming the update and its batch."
    )
    max_steps: int = option(100000, "Stop after this many updates (paper, base: 100,000).")
    max_epochs: int = option(0, "Stop after this many epochs; 0 means no limit.")
    max_minutes: float = option(0.0, "Training time budget in minutes; 0 means no limit.")
    max_length: int = option(
        1024, "Training pairs with more source or target tokens than this are dropped (and counted)."
    )
    dedup: bool = option(
        False, "Remove exact duplicate training pairs (the same source and target ids) when the data "
        "is prepared; the first of each is kept and the count is logged."
    )
    prepare_workers: int = option(
        0, "Processes that encode the training data when it is prepared; 0: one per CPU core."
    )
    data_cache: str = option(
        "", "Deprecated: set data.cache_dir, which moves a run's downloads and prepared data together "
        "(prepared data goes to its prepared/). When set, prepared training data is kept here (a "
        "directory per dataset), with a warning; empty: prepared/ under data.cache_dir, "
        "$SEQTRANS_CACHE_DIR or ~/.cache/seqtrans."
    )
    log_every: int = option(100, "Log loss, learning rate and tokens/s every this many updates (without a "
                            "progress bar, a shorter line between them at least every 30 seconds).")
    tensorboard: bool = option(
        False, "Also write the logged scalars and the validations as TensorBoard event files under the "
        "run directory's tb/ (tensorboard --logdir DIR/tb); needs pip install 'seqtrans[tensorboard]'."
    )
    eval_every: int = option(
        1000, "Validate (loss and the task's metric) every this many updates, and at the end."
    )
    valid_beam: int = option(
        1, "Beam for the validation metric; 1 decodes greedily, 0 uses the decode section's beam."
    )
    valid_max_examples: int = option(
        0, "Decode at most this many dev examples for the validation metric; 0 decodes all."
    )
    patience: int = option(
        0, "Stop after this many validations without a better task metric; 0 disables."
    )
    checkpoint_every: int = option(1000, "Write a checkpoint every this many updates, and at the end.")
    keep_checkpoints: int = option(5, "Keep the last K checkpoints; older ones are deleted.")
    average_last: int = option(
        5, "Average the last N checkpoints into the final model (paper: 5 base, 20 big); 1 keeps the last."
    )
    precision: str = option(
        "auto", "auto: bf16 on a GPU with bfloat16 arithmetic, fp32 elsewhere. bf16: the forward pass "
        "under bfloat16 autocast (CUDA, and CPUs with AMX). fp16 (CUDA only): float16 autocast with "
        "dynamic loss scaling; updates whose gradients overflow are skipped and logged. Weights, "
        "gradients, optimizer state and the loss's softmax stay fp32."
    )
    dist_timeout: float = option(
        1800.0, "Seconds a rank waits for the others at a collective before the job fails "
        "(data-parallel training): a rank that died or hangs ends the job instead of hanging it."
    )

    def __post_init__(self) -> None:
        check_at_least(self, "train", ("max_tokens", "accumulate", "warmup", "max_steps", "max_length",
                                       "log_every", "max_skipped", "eval_every", "checkpoint_every",
                                       "keep_checkpoints", "average_last"), 1)
        check_at_least(self, "train", ("max_epochs", "max_minutes", "valid_beam", "valid_max_examples",
                                       "patience", "clip_norm", "lr_scale", "prepare_workers"), 0)
        for key in ("latency_weight", "latency_weight_var"):
            weight = getattr(self, key)
            if not math.isfinite(weight) or weight < 0:  # NaN compares false: test finiteness first
                raise ConfigError(f"train.{key}", f"must be a finite number, 0 or more, got {weight}")
        if not 0.0 <= self.cooldown <= 1.0:
            raise ConfigError("train.cooldown", f"must be in [0, 1], got {self.cooldown}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError("train.label_smoothing", f"must be in [0, 1), got {self.label_smoothing}")
        if self.subword_sampling < 0.0:
            raise ConfigError("train.subword_sampling", f"must be >= 0, got {self.subword_sampling}")
        check_precision("train.precision", self.precision, TRAIN_PRECISIONS)
        if self.dist_timeout <= 0:
            raise ConfigError("train.dist_timeout", f"must be positive, got {self.dist_timeout}")
        if self.keep_checkpoints < self.average_last:
            raise ConfigError(
                "train.keep_checkpoints",
                f"keeps {self.keep_checkpoints} checkpoints but average_last needs {self.average_last}",
            )
