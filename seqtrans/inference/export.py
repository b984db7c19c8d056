"""Export a trained model to CTranslate2 (https://github.com/OpenNMT/CTranslate2).

The model is described with CTranslate2's own specification API
(``ctranslate2.specs.TransformerSpec``) and its weights copied in, so no converter of
another toolkit is involved. Only what CTranslate2's Transformer can compute exports:
scaled dot-product attention at all three sites, a bidirectional encoder and no model
extension of its task; anything else is a :class:`~seqtrans.errors.ConfigError` naming
the setting (an :class:`~seqtrans.model.extension.ExtensionError` naming the extension).

Differences of layout that the export takes care of:

- seqtrans's sinusoidal position table interleaves [sin, cos] per frequency, where
  CTranslate2's built-in one puts all sines first, so the table is written out
  explicitly (``model.max_positions`` rows, as learned positions are);
- the four special symbols: ``<s>`` starts every output, ``</s>`` ends it and is
  appended to every source (``add_source_eos``), ``<unk>`` stands for unknown tokens;
- tied output projections and shared embeddings are written once (CTranslate2 aliases
  equal variables);
- a run's vocabulary shortlist (``seqtrans shortlist``) becomes CTranslate2's vocabulary
  map, ``vmap.txt``: a line per source token, the token, a tab and its candidates
  separated by spaces, and a line with an empty key for the frequent tokens, which every
  batch may produce (``translate_batch(..., use_vmap=True)`` restricts the output layer to
  the batch's map, as ``decode.shortlist`` does).

``ctranslate2`` is an optional dependency (``pip install 'seqtrans[export]'``), imported
only when an export runs.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seqtrans.config import ModelConfig
from seqtrans.data.vocab import SPECIALS, Vocabularies
from seqtrans.errors import ConfigError, UsageError

if TYPE_CHECKING:  # torch is imported by the export itself, not by the command line reading FORMATS
    import numpy as np
    from torch import Tensor, nn

    from seqtrans.model.layers import FeedForward
    from seqtrans.model.transformer import Transformer
    from seqtrans.shortlist.table import Shortlist

log = logging.getLogger(__name__)

FORMATS = ("ctranslate2",)
# the weight types CTranslate2 converts to (ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES)
QUANTIZATIONS = ("float32", "float16", "bfloat16", "int8", "int8_float32", "int8_float16",
                 "int8_bfloat16", "int16")


def unsupported(config: ModelConfig) -> list[tuple[str, str]]:
    """The settings of ``config`` CTranslate2's Transformer cannot compute, as
    (config key, why) pairs; empty when the model exports."""
    problems = []
    for key in ("encoder_attention", "decoder_attention", "cross_attention"):
        name = getattr(config, key)
        if name != "scaled_dot":
            problems.append((f"model.{key}", f"'{name}' attention has no CTranslate2 counterpart; "
                                             "only scaled_dot models export"))
    if config.causal_encoder:
        problems.append(("model.causal_encoder", "CTranslate2's encoder is bidirectional"))
    if config.wait_k:
        problems.append(("model.wait_k", "CTranslate2's encoder-decoder attention has no wait-k mask"))
    if config.positions == "relative":
        problems.append(("model.positions", "this export writes a table of absolute positions; relative "
                                            "position biases are not written"))
    # options this export does not write yet (the position table is written out whatever its layout)
    defaults = ModelConfig()
    for key in ("activation", "gated_ffn", "scale_embeddings", "embedding_norm", "output_bias", "norm_kind",
                "bias", "attention_scale", "head_dim", "scale_output"):
        if getattr(config, key) != getattr(defaults, key):
            problems.append((f"model.{key}", f"this export writes only {key}={getattr(defaults, key)!r}"))
    return problems


def check_exportable(config: ModelConfig) -> None:
    """Raise a :class:`ConfigError` naming the first setting CTranslate2 cannot represent."""
    problems = unsupported(config)
    if problems:
        key, why = problems[0]
        raise ConfigError(key, f"cannot export to CTranslate2: {why}")


def _ctranslate2() -> Any:
    try:
        import ctranslate2
    except ImportError:
        raise UsageError("exporting to CTranslate2 needs the ctranslate2 package: "
                         "pip install 'seqtrans[export]'") from None
    return ctranslate2


def _array(t: Tensor) -> np.ndarray:
    return t.detach().float().cpu().contiguous().numpy()


def _linear(spec: Any, module: nn.Linear) -> None:
    spec.weight = _array(module.weight)
    if module.bias is not None:
        spec.bias = _array(module.bias)


def _layer_norm(spec: Any, module: nn.Module) -> None:
    from torch import nn

    if not isinstance(module, nn.LayerNorm):
        raise TypeError(f"expected a LayerNorm, got {type(module).__name__}")
    spec.gamma = _array(module.weight)
    spec.beta = _array(module.bias)


def _attention(spec: Any, module: object, *, cross: bool) -> None:
    """Self-attention: linear[0] the fused [q; k; v], linear[1] the output. Encoder-decoder
    attention: linear[0] q, linear[1] the fused [k; v], linear[2] the output."""
    from seqtrans.attention import CrossAttention, SelfAttention

    if cross:
        if not isinstance(module, CrossAttention):
            raise TypeError(f"expected scaled dot-product attention, got {type(module).__name__}")
        linears = [module.q, module.kv, module.out]
    else:
        if not isinstance(module, SelfAttention):
            raise TypeError(f"expected scaled dot-product attention, got {type(module).__name__}")
        linears = [module.qkv, module.out]
    for linear_spec, linear in zip(spec.linear, linears, strict=True):
        _linear(linear_spec, linear)


def _feed_forward(spec: Any, ffn: FeedForward, norm: nn.Module) -> None:
    _linear(spec.linear_0, ffn.inner)
    _linear(spec.linear_1, ffn.outer)
    _layer_norm(spec.layer_norm, norm)


def ctranslate2_spec(model: Transformer, vocabularies: Vocabularies) -> Any:
    """The ``ctranslate2.specs.TransformerSpec`` of ``model``, its weights filled in
    (float32), its vocabularies registered."""
    c = model.config
    check_exportable(c)
    model.check_supported("export")
    ct2 = _ctranslate2()
    from ctranslate2.specs import TransformerSpec  # the package is present: checked above

    pre = c.norm == "pre"
    spec = TransformerSpec.from_config((c.encoder_layers, c.decoder_layers), c.heads, pre_norm=pre)
    # the same table serves encoder and decoder; it is copied, and aliased on save
    assert model.positions is not None  # relative positions do not export (check_exportable)
    positions = _array(model.positions(c.max_positions, device=model.target_embed.weight.device))  # [P, D]

    enc = spec.encoder
    enc.embeddings[0].weight = _array(model.source_embed.weight)
    enc.position_encodings.encodings = positions
    for layer_spec, layer in zip(enc.layer, model.encoder_layers):
        _attention(layer_spec.self_attention, layer.self_attn, cross=False)
        _layer_norm(layer_spec.self_attention.layer_norm, layer.r1.norm)
        _feed_forward(layer_spec.ffn, layer.ffn, layer.r2.norm)
    if pre:
        _layer_norm(enc.layer_norm, model.encoder_norm)

    dec = spec.decoder
    dec.embeddings.weight = _array(model.target_embed.weight)
    dec.position_encodings.encodings = positions.copy()
    dec.projection.weight = _array(model.output_weight)  # no bias, as in seqtrans
    for layer_spec, dec_layer in zip(dec.layer, model.decoder_layers):
        _attention(layer_spec.self_attention, dec_layer.self_attn, cross=False)
        _layer_norm(layer_spec.self_attention.layer_norm, dec_layer.r1.norm)
        _attention(layer_spec.attention, dec_layer.cross_attn, cross=True)
        _layer_norm(layer_spec.attention.layer_norm, dec_layer.r2.norm)
        _feed_forward(layer_spec.ffn, dec_layer.ffn, dec_layer.r3.norm)
    if pre:
        _layer_norm(dec.layer_norm, model.decoder_norm)

    _, bos, eos, unk = SPECIALS
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = unk, bos, eos
    spec.config.decoder_start_token = bos
    spec.config.add_source_eos = True  # every seqtrans source ends in EOS
    spec.config.layer_norm_epsilon = c.norm_eps
    spec.register_source_vocabulary(list(vocabularies.source.symbols))
    spec.register_target_vocabulary(list(vocabularies.target.symbols))
    log.debug("built a CTranslate2 %s spec with ctranslate2 %s", spec.name, ct2.__version__)
    return spec


def vocabulary_map(shortlist: Shortlist, vocabularies: Vocabularies) -> str:
    """The text of CTranslate2's vocabulary map (``vmap.txt``) of a shortlist."""
    source, target = vocabularies.source.symbols, vocabularies.target.symbols
    lines = ["\t" + " ".join(target[i] for i in shortlist.frequent)]
    for s, row in enumerate(shortlist.candidates):
        found = [target[i] for i in row if i >= 0]
        if found and s < len(source):
            lines.append(source[s] + "\t" + " ".join(found))
    return "".join(line + "\n" for line in lines)


def export_ctranslate2(model: Transformer, vocabularies: Vocabularies, out: str | Path, *,
                       quantization: str | None = None, shortlist: Shortlist | None = None) -> Path:
    """Write ``model`` as a CTranslate2 model directory ``out`` (which must not exist),
    its weights stored as ``quantization`` (one of :data:`QUANTIZATIONS`; float32 when
    None), with ``shortlist`` as its vocabulary map (:func:`vocabulary_map`). The
    directory appears whole or not at all: it is written beside ``out`` under a temporary
    name, then renamed."""
    out = Path(out)
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise UsageError(f"unknown quantization '{quantization}'; choose one of {', '.join(QUANTIZATIONS)}")
    if out.exists():
        raise UsageError(f"{out} exists; remove it or choose another output directory")
    spec = ctranslate2_spec(model, vocabularies)
    try:
        spec.validate()
    except ValueError as exc:  # e.g. a vocabulary of another size than the model's embeddings
        raise UsageError(f"the model does not fit its description for CTranslate2: {exc}") from None
    spec.optimize(quantization=quantization)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        if shortlist is not None:
            with tempfile.TemporaryDirectory(prefix="seqtrans-vmap-") as where:
                vmap = Path(where) / "vmap.txt"
                vmap.write_text(vocabulary_map(shortlist, vocabularies), encoding="utf-8")
                spec.register_vocabulary_mapping(str(vmap))
                spec.save(str(scratch))
        else:
            spec.save(str(scratch))
        os.rename(scratch, out)  # atomic; fails if a non-empty out appeared meanwhile
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return out


# an export reads the float weights, whatever precision the run decodes in
FLOAT = ["decode.precision=fp32"]


def export(run: str | Path, *, to: str, out: str | Path, quantization: str | None = None) -> Path:
    """Export the trained model of a run directory (or checkpoint) ``run`` to format
    ``to`` (one of :data:`FORMATS`, or a format a plugin registers,
    :mod:`seqtrans.inference.formats`) in the new directory ``out``."""
    from seqtrans.inference import formats
    from seqtrans.inference.loading import load

    if to not in FORMATS:
        if to not in formats.names():
            raise UsageError(f"unknown export format '{to}'; choose one of "
                             f"{', '.join([*FORMATS, *formats.names()])}")
        if quantization is not None:
            raise UsageError(f"--quantization is for ctranslate2; format '{to}' stores float32 weights")
        plugin_format = formats.load(to)
        out = Path(out)
        if out.exists():
            raise UsageError(f"{out} exists; remove it or choose another output directory")
        return plugin_format.export_model(load(run, overrides=FLOAT, device="cpu"), out=out)
    loaded = load(run, overrides=FLOAT, device="cpu")
    return export_ctranslate2(loaded.model, loaded.codec.vocabularies, out, quantization=quantization,
                              shortlist=_run_shortlist(run, loaded.vocabulary_digest))


def _run_shortlist(run: str | Path, vocabulary: str) -> Shortlist | None:
    """The run's vocabulary shortlist where it has one (checked against its vocabulary)."""
    from seqtrans.inference.loading import find_checkpoint, run_directory
    from seqtrans.shortlist import table as shortlists

    path = run_directory(find_checkpoint(run)) / shortlists.FILE
    return shortlists.load(path, vocabulary=vocabulary) if path.is_file() else None
