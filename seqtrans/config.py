"""Run configuration: frozen dataclasses whose fields carry their default and help text.

Every default lives here once. A run's configuration is resolved in layers, each
overriding the last:

1. the field defaults below (the paper's settings),
2. the task's ``defaults`` (its decoding settings, say),
3. a preset: the task's own, or one of :data:`PRESETS`,
4. a ``--config`` file (JSON or TOML),
5. ``--set key=value`` pairs, dotted (``model.d_model=256``).

Unknown keys and values of the wrong type raise :class:`~seqtrans.errors.ConfigError`
naming the key. The task's own options form the ``data`` section.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from seqtrans.errors import ConfigError, UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


def option(default: Any, help: str) -> Any:
    """A dataclass field with its default and the help text the CLI and docs show."""
    return field(default=default, metadata={"help": help})


# Attention mechanisms (docs/attention.md); seqtrans.attention builds them by these names.
Mechanism = Literal["scaled_dot", "dot", "general", "additive", "location", "restricted", "local",
                    "memory", "monotonic"]
SELF_MECHANISMS = ("scaled_dot", "dot", "general", "additive", "location", "restricted")
CROSS_MECHANISMS = ("scaled_dot", "dot", "general", "additive", "location", "local", "memory", "monotonic")


@dataclass(frozen=True)
class ModelConfig:
    """The Transformer's shape (paper, section 3 and Table 3)."""

    encoder_layers: int = option(6, "N, the number of encoder layers.")
    decoder_layers: int = option(6, "N, the number of decoder layers.")
    d_model: int = option(512, "Model width d_model; d_k = d_v = d_model / heads.")
    d_ff: int = option(2048, "Inner width of the position-wise feed-forward layers.")
    heads: int = option(8, "h, the number of attention heads.")
    dropout: float = option(
        0.1, "P_drop: dropout on each sub-layer output and on embedding + position sums."
    )
    attention_dropout: float = option(0.0, "Dropout on attention weights (not in the paper).")
    activation_dropout: float = option(0.0, "Dropout after the feed-forward ReLU (not in the paper).")
    norm: Literal["post", "pre"] = option(
        "post", "'post': LayerNorm(x + Sublayer(x)) as in the paper; 'pre': x + Sublayer(LayerNorm(x))."
    )
    positions: Literal["sinusoidal", "learned"] = option(
        "sinusoidal", "Positional encodings: sinusoidal, or learned (Table 3, row E)."
    )
    max_positions: int = option(1024, "Longest sequence learned positions can encode.")
    share_embeddings: bool = option(
        True, "Share source and target embeddings when the task's vocabulary is shared."
    )
    tie_output: bool = option(True, "Tie the pre-softmax projection to the target embeddings.")
    source_cursor: bool = option(
        False, "Add to each decoder input the (projected) encoder state of the first source unit its "
        "output has not yet consumed, for tasks whose codec declares a walk over the source "
        "(SourceWalking; docs/design.md, 'The source cursor').")
    encoder_attention: Mechanism = option(
        "scaled_dot", "Encoder self-attention: scaled_dot, dot, general, additive, location or "
        "restricted (docs/attention.md)."
    )
    decoder_attention: Mechanism = option(
        "scaled_dot", "Decoder self-attention (causal): scaled_dot, dot, general, additive, location "
        "or restricted."
    )
    cross_attention: Mechanism = option(
        "scaled_dot", "Encoder-decoder attention: scaled_dot, dot, general, additive, location, local, "
        "memory or monotonic."
    )
    causal_encoder: bool = option(
        False, "Unidirectional encoder: each source position attends only to itself and earlier "
        "ones, so encoding can follow a source as it arrives (needed by 'predict --stream')."
    )
    location_max_length: int = option(
        0, "location: the longest sequence it can attend over (W_a has a row per position and "
        "head); required where a site uses location."
    )
    restricted_radius: int = option(
        16, "restricted: r, each position attends to those at most r away (the r before it, when causal)."
    )
    local_window: int = option(
        10, "local: D, the window is [p - D, p + D] around the aligned position p; the Gaussian of "
        "local-p has sigma = D / 2 (Luong et al.: D = 10)."
    )
    local_alignment: Literal["predictive", "monotonic"] = option(
        "predictive", "local: 'predictive' (local-p) predicts p = S * sigmoid(v_p^T tanh(W_p h)) and "
        "weights the window by a Gaussian; 'monotonic' (local-m) sets p to the target position."
    )
    memory_slots: int = option(
        32, "memory: K, the number of attention contexts computed once per source (Britz et al.: 1-64)."
    )
    memory_encoder_score: Literal["softmax", "sigmoid"] = option(
        "softmax", "memory: alpha = score(W_alpha s) over source positions: softmax, or sigmoid."
    )
    memory_decoder_score: Literal["softmax", "sigmoid"] = option(
        "softmax", "memory: beta = score(W_beta h) over the K contexts: softmax, or sigmoid."
    )
    memory_positions: bool = option(
        False, "memory: multiply the encoder scores by the position encodings "
        "L_ks = (1 - k/K)(1 - s/S) + (k/K)(s/S), with S each source's own length."
    )
    monotonic_dim: int = option(
        0, "monotonic: width of the energy's hidden layer tanh(W s + V h + b); 0 means d_model."
    )
    monotonic_noise: float = option(
        1.0, "monotonic: standard deviation of the Gaussian noise added to the energies before the "
        "sigmoid while training (Raffel et al.: 1); never at test time."
    )
    monotonic_r_init: float = option(
        -4.0, "monotonic: initial value of the energy's scalar bias r; negative so that selection "
        "probabilities start low and the expected alignment is not stuck at the first position."
    )

    def __post_init__(self) -> None:
        for key in ("encoder_layers", "decoder_layers", "d_model", "d_ff", "heads", "max_positions",
                    "restricted_radius", "local_window", "memory_slots"):
            if getattr(self, key) < 1:
                raise ConfigError(f"model.{key}", f"must be at least 1, got {getattr(self, key)}")
        for key in ("location_max_length", "monotonic_dim", "monotonic_noise"):
            if getattr(self, key) < 0:
                raise ConfigError(f"model.{key}", f"must not be negative, got {getattr(self, key)}")
        for key in ("encoder_attention", "decoder_attention"):
            name = getattr(self, key)
            if name not in SELF_MECHANISMS:
                raise ConfigError(
                    f"model.{key}", f"'{name}' is not a self-attention mechanism"
                    + (" (it attends from the target to the source: use it as model.cross_attention)"
                       if name in CROSS_MECHANISMS else "")
                    + f"; choose one of {', '.join(SELF_MECHANISMS)}")
        if self.cross_attention not in CROSS_MECHANISMS:
            raise ConfigError(
                "model.cross_attention", f"'{self.cross_attention}' is a self-attention mechanism; "
                f"choose one of {', '.join(CROSS_MECHANISMS)} (local is restricted attention's "
                "encoder-decoder counterpart)")
        using_location = [key for key in ("encoder_attention", "decoder_attention", "cross_attention")
                          if getattr(self, key) == "location"]
        if using_location and self.location_max_length < 1:
            raise ConfigError(
                "model.location_max_length",
                f"model.{using_location[0]}=location needs the longest sequence it attends over; "
                "set it to at least the longest source (and target, at self-attention sites) plus one")
        if self.d_model % self.heads:
            raise ConfigError(
                "model.heads", f"d_model {self.d_model} is not divisible by {self.heads} heads"
            )
        for key in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"model.{key}", f"must be in [0, 1), got {getattr(self, key)}")


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
    subword_sampling: float = option(
        0.0, "Subword regularization (Kudo 2018): every epoch, re-encode the training sources with "
        "segmentations sampled from the task's unigram model at this smoothing alpha (smaller: more "
        "varied); 0 keeps one segmentation. Needs a task whose codec samples segmentations "
        "(SegmentationSampling)."
    )
    clip_norm: float = option(0.0, "Clip the gradient norm to this value; 0 disables clipping.")
    max_steps: int = option(100000, "Stop after this many updates (paper, base: 100,000).")
    max_epochs: int = option(0, "Stop after this many epochs; 0 means no limit.")
    max_minutes: float = option(0.0, "Training time budget in minutes; 0 means no limit.")
    max_length: int = option(
        1024, "Training pairs with more source or target tokens than this are dropped (and counted)."
    )
    log_every: int = option(100, "Log loss, learning rate and tokens/s every this many updates.")
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
        "fp32", "fp32, or bf16: run the forward pass under bfloat16 autocast (for CUDA and CPUs with "
        "AMX); weights, gradients, optimizer state and the loss's softmax stay fp32."
    )

    def __post_init__(self) -> None:
        positive = ("max_tokens", "accumulate", "warmup", "max_steps", "max_length", "log_every",
                    "eval_every", "checkpoint_every", "keep_checkpoints", "average_last")
        for key in positive:
            if getattr(self, key) < 1:
                raise ConfigError(f"train.{key}", f"must be at least 1, got {getattr(self, key)}")
        for key in ("max_epochs", "max_minutes", "valid_beam", "valid_max_examples", "patience",
                    "clip_norm", "lr_scale"):
            if getattr(self, key) < 0:
                raise ConfigError(f"train.{key}", f"must not be negative, got {getattr(self, key)}")
        if not 0.0 <= self.cooldown <= 1.0:
            raise ConfigError("train.cooldown", f"must be in [0, 1], got {self.cooldown}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError("train.label_smoothing", f"must be in [0, 1), got {self.label_smoothing}")
        if self.subword_sampling < 0.0:
            raise ConfigError("train.subword_sampling", f"must be >= 0, got {self.subword_sampling}")
        _check_precision("train.precision", self.precision)
        if self.keep_checkpoints < self.average_last:
            raise ConfigError(
                "train.keep_checkpoints",
                f"keeps {self.keep_checkpoints} checkpoints but average_last needs {self.average_last}",
            )


@dataclass(frozen=True)
class DecodeConfig:
    """Search settings (paper, section 6.1); tasks set their own defaults."""

    beam: int = option(4, "Beam size; 1 decodes greedily.")
    alpha: float = option(0.6, "Length penalty alpha of lp(Y) = ((5 + |Y|) / 6)^alpha; 0 disables.")
    max_len_a: float = option(1.0, "Maximum output length a * |x| + b: the a.")
    max_len_b: int = option(50, "Maximum output length a * |x| + b: the b.")
    min_len: int = option(0, "Minimum output length in tokens, where the maximum allows it.")
    nbest: int = option(1, "Hypotheses returned per input (at most the beam size).")
    batch_tokens: int = option(8000, "Source tokens (padding included) per decoding batch.")
    constrained: bool = option(True, "Apply the task's constraint on next tokens, where it has one.")
    compare_unconstrained: bool = option(
        False, "Also decode the test split without the task's constraint and report those metrics "
        "with the prefix 'unconstrained_'."
    )
    precision: str = option(
        "fp32", "fp32, or bf16: decode under bfloat16 autocast (for CUDA and CPUs with AMX); scores "
        "are accumulated in fp32."
    )

    def __post_init__(self) -> None:
        for key in ("beam", "nbest", "batch_tokens"):
            if getattr(self, key) < 1:
                raise ConfigError(f"decode.{key}", f"must be at least 1, got {getattr(self, key)}")
        if self.nbest > self.beam:
            raise ConfigError("decode.nbest", f"nbest {self.nbest} exceeds the beam size {self.beam}")
        for key in ("alpha", "max_len_a", "max_len_b", "min_len"):
            if getattr(self, key) < 0:
                raise ConfigError(f"decode.{key}", f"must not be negative, got {getattr(self, key)}")
        _check_precision("decode.precision", self.precision)


#: Values of ``train.precision`` and ``decode.precision``.
PRECISIONS = ("fp32", "bf16")


def _check_precision(key: str, value: str) -> None:
    if value not in PRECISIONS:
        raise ConfigError(key, f"must be one of {', '.join(PRECISIONS)}, got {value!r}")


@dataclass(frozen=True)
class RunConfig:
    """Everything one run needs; written to ``DIR/config.json`` fully resolved."""

    task: str = option("copy", "The task plugin's name.")
    seed: int = option(1, "Seed for initialisation, batching, dropout and generated data.")
    model: ModelConfig = field(default_factory=ModelConfig, metadata={"help": "Model shape."})
    train: TrainConfig = field(default_factory=TrainConfig, metadata={"help": "Training."})
    decode: DecodeConfig = field(default_factory=DecodeConfig, metadata={"help": "Decoding."})
    data: Any = field(default=None, metadata={"help": "The task's own options."})


# The paper's two models (Table 3) as run-config overrides, usable with any task.
PRESETS: dict[str, dict[str, Any]] = {
    "base": {
        "model": {"encoder_layers": 6, "decoder_layers": 6, "d_model": 512, "d_ff": 2048,
                  "heads": 8, "dropout": 0.1},
        "train": {"average_last": 5, "keep_checkpoints": 5},
    },
    "big": {
        "model": {"encoder_layers": 6, "decoder_layers": 6, "d_model": 1024, "d_ff": 4096,
                  "heads": 16, "dropout": 0.3},
        "train": {"average_last": 20, "keep_checkpoints": 20, "max_steps": 300000},
    },
}


# --------------------------------------------------------------------------- conversion


def to_dict(config: Any) -> Any:
    """A JSON-ready nested dict of a config dataclass (tuples become lists)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return {f.name: to_dict(getattr(config, f.name)) for f in dataclasses.fields(config)}
    if isinstance(config, (tuple, list)):
        return [to_dict(v) for v in config]
    return config


def _field_types(cls: type, data_cls: type | None) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    types_ = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    if cls is RunConfig:
        types_["data"] = data_cls
    return types_


def _unknown_key(key: str, known: Iterable[str]) -> ConfigError:
    leaf = key.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(leaf, list(known), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(sorted(known))}"
    return ConfigError(key, "unknown key" + hint)


def from_dict(cls: type, values: Mapping[str, Any], *, data_cls: type | None = None,
              prefix: str = "") -> Any:
    """Build ``cls`` from a nested mapping, checking every key and value type."""
    if not isinstance(values, Mapping):
        raise ConfigError(prefix.rstrip(".") or "<root>", f"expected a table of keys, got {values!r}")
    types_ = _field_types(cls, data_cls)
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        dotted = prefix + key
        if key not in types_:
            raise _unknown_key(dotted, types_)
        tp: Any = types_[key]
        if tp is None:
            raise ConfigError(dotted, "this task has no options")
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            kwargs[key] = from_dict(tp, value, data_cls=data_cls, prefix=dotted + ".")
        else:
            kwargs[key] = _coerce(value, tp, dotted)
    if cls is RunConfig and "data" not in kwargs and data_cls is not None:
        kwargs["data"] = data_cls()
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field of a task's config is missing
        raise ConfigError(prefix.rstrip(".") or "<root>", str(exc)) from None


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check (and widen int to float) a value parsed from JSON or TOML."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin is Literal:
        if value not in args:
            raise ConfigError(key, f"must be one of {', '.join(map(repr, args))}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(exc.problem)
        raise ConfigError(key, f"expected {_type_name(tp)}, got {value!r}")
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"expected a list of {len(args)} values, got {value!r}")
        if args and args[-1] is not Ellipsis and len(value) != len(args):
            raise ConfigError(key, f"expected {len(args)} values, got {len(value)}")
        item_types = [args[0]] * len(value) if args and args[-1] is Ellipsis else list(args)
        return tuple(_coerce(v, t, key) for v, t in zip(value, item_types))
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(key, f"expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(key, f"expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return value
    raise ConfigError(key, f"unsupported option type {tp!r}")  # pragma: no cover


_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}


def parse_text(text: str, tp: Any, key: str) -> Any:
    """Cast the text of ``--set key=text`` to the field's type."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if text.lower() in ("none", "null") and type(None) in args:
            return None
        for arg in args:
            if arg is not type(None):
                try:
                    return parse_text(text, arg, key)
                except ConfigError:
                    pass
        raise ConfigError(key, f"expected {_type_name(tp)}, got {text!r}")
    if origin is tuple:
        parts = [p.strip() for p in text.strip("()[] ").split(",") if p.strip()]
        item_types = [args[0]] * len(parts) if args and args[-1] is Ellipsis else list(args)
        if len(item_types) != len(parts):
            raise ConfigError(key, f"expected {len(args)} comma-separated values, got {text!r}")
        return tuple(parse_text(p, t, key) for p, t in zip(parts, item_types))
    if origin is Literal:
        return _coerce(text, tp, key)
    if tp is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ConfigError(key, f"expected true or false, got {text!r}")
    if tp is int:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(key, f"expected an integer, got {text!r}") from None
    if tp is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(key, f"expected a number, got {text!r}") from None
    if tp is str or tp is Any:
        return text
    raise ConfigError(key, f"unsupported option type {tp!r}")  # pragma: no cover


# --------------------------------------------------------------------------- layering


def merge(base: dict[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """Nested merge: tables merge key by key, anything else replaces."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(dict(out[key]), value)
        else:
            out[key] = value
    return out


def parse_overrides(pairs: Iterable[str], *, data_cls: type | None) -> dict[str, Any]:
    """Turn ``["model.d_model=256", ...]`` into a nested dict of typed values."""
    tree: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise UsageError(f"--set expects key=value, got {pair!r}")
        key, text = pair.split("=", 1)
        key = key.strip()
        parts = key.split(".")
        cls: Any = RunConfig
        node = tree
        for i, part in enumerate(parts):
            dotted = ".".join(parts[: i + 1])
            if not (dataclasses.is_dataclass(cls) and isinstance(cls, type)):
                raise ConfigError(dotted, f"'{'.'.join(parts[:i])}' is not a section")
            types_ = _field_types(cls, data_cls)
            if part not in types_:
                raise _unknown_key(dotted, types_)
            cls = types_[part]
            if i < len(parts) - 1:
                node = node.setdefault(part, {})
        if dataclasses.is_dataclass(cls):
            raise ConfigError(key, "is a section; set one of its keys, e.g. " f"{key}.<key>=...")
        node[parts[-1]] = parse_text(text.strip(), cls, key)
    return tree


def load_file(path: str | Path) -> dict[str, Any]:
    """Read a JSON or TOML config file into a nested dict."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read config file: {exc.strerror}") from None
    try:
        if path.suffix == ".toml":
            loaded = tomllib.loads(raw.decode("utf-8"))
        else:
            loaded = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not valid {'TOML' if path.suffix == '.toml' else 'JSON'}: {exc}") from None
    if not isinstance(loaded, dict):
        raise UsageError(f"{path}: expected a table of config sections")
    return loaded


def preset_names(task_presets: Mapping[str, Mapping[str, Any]]) -> list[str]:
    return sorted(set(task_presets) | set(PRESETS))


def resolve(
    task_name: str,
    *,
    data_cls: type | None,
    task_defaults: Mapping[str, Any] = {},
    task_presets: Mapping[str, Mapping[str, Any]] = {},
    preset: str | None = None,
    config_file: str | Path | None = None,
    overrides: Iterable[str] = (),
) -> RunConfig:
    """Resolve a run's configuration through the layers described in the module docstring.

    With no ``preset``, the task's preset named ``default`` applies where it has one.
    """
    tree: dict[str, Any] = merge({}, task_defaults)
    if preset is None and "default" in task_presets:
        preset = "default"
    if preset is not None:
        if preset in task_presets:
            tree = merge(tree, task_presets[preset])
        elif preset in PRESETS:
            tree = merge(tree, PRESETS[preset])
        else:
            raise UsageError(
                f"unknown preset '{preset}' for task '{task_name}'; "
                f"available: {', '.join(preset_names(task_presets))}"
            )
    if config_file is not None:
        loaded = load_file(config_file)
        if loaded.get("task", task_name) != task_name:
            raise UsageError(f"{config_file}: is a config for task '{loaded['task']}', not '{task_name}'")
        tree = merge(tree, loaded)
    tree = merge(tree, parse_overrides(overrides, data_cls=data_cls))
    tree["task"] = task_name
    if data_cls is None:
        tree.pop("data", None)
    return from_dict(RunConfig, tree, data_cls=data_cls)


def describe(config: Any, *, prefix: str = "") -> list[tuple[str, str, Any, str]]:
    """``(key, type, value, help)`` for every leaf option of a resolved config.

    ``seqtrans config`` and the generated docs print this, so the help text lives once.
    """
    rows = []
    data_cls = type(config.data) if isinstance(config, RunConfig) and config.data is not None else None
    types_ = _field_types(type(config), data_cls)
    for f in dataclasses.fields(config):
        tp = types_[f.name]
        value = getattr(config, f.name)
        if tp is None:
            continue
        if dataclasses.is_dataclass(tp):
            rows += describe(value, prefix=prefix + f.name + ".")
        else:
            rows.append((prefix + f.name, _type_name(tp), value, f.metadata.get("help", "")))
    return rows


def markdown_table(config: Any, *, prefix: str = "") -> str:
    """A Markdown table of every option of ``config``: key, type, value, help."""
    lines = ["| key | type | default | help |", "|---|---|---|---|"]
    for key, type_name, value, help_text in describe(config, prefix=prefix):
        shown = json.dumps(to_dict(value))
        lines.append(f"| `{key}` | {type_name.replace('|', '/')} | `{shown}` | {help_text} |")
    return "\n".join(lines) + "\n"
