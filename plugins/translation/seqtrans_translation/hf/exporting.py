"""``seqtrans export RUN_DIR --to hf OUT``: a model imported with ``seqtrans import hf``,
fine-tuned or not, written back as the Hugging Face model directory it came from, which
``from_pretrained`` loads: its own ``config.json`` (a T5 model's written from its
options, :func:`.t5.config_json`), ``generation_config.json`` and
``tokenizer_config.json``, its tokenizer's file (``tokenizer.json``, or ``spiece.model``;
ByT5 has none), and the weights as ``model.safetensors``, renamed by the family's
``key_map`` (:mod:`.bart`, :mod:`.t5`), the table the import reads, and reordered.

The model's rows come back from seqtrans's symbols: each of the model's ids takes the
row of the symbol that names it. seqtrans's ``<s>`` is a copy of the model's decoder
start row (:mod:`.vocabulary`), which fine-tuning may have moved away from the row of
the same id's own symbol: the model has one row where seqtrans has two. The BART
family's is ``</s>``, an output too, and the exported row is the end's; T5's is its
padding, which the model reads nowhere else (it is masked) and never emits, so the
exported row is ``<s>``'s, and an untied head keeps the padding's own output row. What
the format has no place for is refused before anything is written: an output bias that
fine-tuning trained in a family without one (M2M-100, NLLB, T5), a model option T5's
``config.json`` cannot hold, an ensemble, an int8-only model, a task's model extensions.

Shapes: V the model's vocabulary, V' = V + 1 seqtrans's, D d_model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from seqtrans.plugin import BOS, EOS, PAD, TextCodec, UsageError, new_directory
from seqtrans_translation.hf import bart, t5
from seqtrans_translation.hf.codec import TOKENIZER_CONFIG, TOKENIZER_FILES, HFCodec
from seqtrans_translation.hf.directory import CONFIG, GENERATION_CONFIG
from seqtrans_translation.hf_marian.tensors import SAFETENSORS, write_safetensors

if TYPE_CHECKING:
    from seqtrans import Loaded


def _rows_back(table: Tensor, hf_ids: tuple[int, ...], size: int, *, start_row: bool = False) -> Tensor:
    """The model's table [V, ...] from seqtrans's [V', ...]: each id takes the row of the
    first symbol naming it, ``<s>`` last (a copy of the decoder start's row); with
    ``start_row`` the decoder start's id takes the row of ``<s>``."""
    source: dict[int, int] = {hf_ids[BOS]: BOS} if start_row else {}
    for ours, theirs in enumerate(hf_ids):
        if ours != BOS:
            source.setdefault(theirs, ours)
    source.setdefault(hf_ids[BOS], BOS)
    index = torch.tensor([source[i] for i in range(size)])  # [V]
    return table.index_select(0, index).contiguous()


def _bias(state: dict[str, Tensor]) -> Tensor:
    """The output bias without seqtrans's own absent ``<s>``.  -> [V']"""
    bias = state["output_bias"].clone()
    bias[BOS] = 0.0
    return bias


def weights(loaded: Loaded, codec: HFCodec, config: dict[str, Any]) -> dict[str, Tensor]:
    """The model's tensors by its own names."""
    c = loaded.config.model
    state = {k: v.detach().float().cpu() for k, v in loaded.model.state_dict().items()}
    size = int(config["vocab_size"])
    hf_ids = codec.ids.hf_ids
    kind = config["model_type"]
    family = t5 if kind in t5.MODEL_TYPES else bart
    if family is t5:
        if _bias(state).abs().max() > 0:
            raise UsageError("the model's output bias has changed (this run trained it: "
                             "model.fixed_output_bias=false), and T5 models have no place for one: it "
                             "cannot be exported without changing the outputs")
        # T5 starts its decoder from its padding row, masked wherever else it is read: the row
        # every output is conditioned on is seqtrans's <s>
        shared = _rows_back(state["target_embed.weight"], hf_ids, size, start_row=True)
        out = {"shared.weight": shared}
        if not c.tie_output:  # the padding's own output row, which seqtrans never emits either
            out["lm_head.weight"] = _rows_back(state["output.weight"], hf_ids, size)
        elif config.get("tie_word_embeddings") is False:  # so written to say "unscaled": the shared rows
            out["lm_head.weight"] = shared.clone()
    else:
        out = {"model.shared.weight": _rows_back(state["target_embed.weight"], hf_ids, size)}
        if not c.tie_output:
            out["lm_head.weight"] = _rows_back(state["output.weight"], hf_ids, size)
        bias = _bias(state)
        if kind == "m2m_100":
            if bias.abs().max() > 0:
                raise UsageError("the model's output bias has changed (this run trained it: "
                                 "model.fixed_output_bias=false), and M2M-100 and NLLB models have no "
                                 "place for one: it cannot be exported without changing the outputs")
        else:
            out["final_logits_bias"] = _rows_back(bias, hf_ids, size).unsqueeze(0)  # [1, V]
    for ours, parts in family.key_map(c):
        sizes = [shape[0] for _, shape in parts]
        for (name, _), piece in zip(parts, state[ours].split(sizes)):
            out[name] = piece.contiguous()
    return out


def _files(loaded: Loaded, codec: HFCodec, config: dict[str, Any]) -> dict[str, bytes]:
    """Every file of the directory but the weights: the ones the model came with (a T5
    model's ``config.json`` written from its options), its tokenizer's file, and for
    what it came without, the settings transformers needs."""
    files = dict(codec.originals)
    hf_ids = codec.ids.hf_ids
    if config["model_type"] in t5.MODEL_TYPES:
        files[CONFIG] = _json(t5.config_json(loaded.config.model, config, Path(CONFIG)))
    tokenizer_file = TOKENIZER_FILES[codec.tokenizer_kind]
    if tokenizer_file is not None:
        files[tokenizer_file] = codec.tokenizer_json
    elif TOKENIZER_CONFIG not in files:  # ByT5's bytes: transformers finds its tokenizer by this name
        files[TOKENIZER_CONFIG] = _json({"tokenizer_class": "ByT5Tokenizer", "extra_ids": len(codec.added),
                                         "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"})
    if GENERATION_CONFIG not in files:
        files[GENERATION_CONFIG] = _json({"decoder_start_token_id": hf_ids[BOS], "eos_token_id": hf_ids[EOS],
                                          "pad_token_id": hf_ids[PAD]})
    return files


def _json(data: dict[str, Any]) -> bytes:
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def export_hf(loaded: Loaded, *, out: Path) -> Path:
    """Write ``loaded`` as the Hugging Face model directory ``out``, whole or not at all:
    everything that can be refused is, before the directory is begun."""
    codec = loaded.codec
    if isinstance(codec, TextCodec):  # a run of another task that kept this model's codec
        codec = codec.codec
    if not isinstance(codec, HFCodec) or CONFIG not in dict(codec.originals):
        raise UsageError("--to hf writes models imported with 'seqtrans import hf' (their config.json is "
                         "kept with them); a model trained here exports with --to hf-marian or --to "
                         "ctranslate2")
    config = json.loads(dict(codec.originals)[CONFIG])
    kinds = bart.MODEL_TYPES + t5.MODEL_TYPES
    if config.get("model_type") not in kinds:
        raise UsageError(f"--to hf does not write model_type {config.get('model_type')!r} (it writes "
                         f"{', '.join(kinds)})")
    if loaded.others:
        raise UsageError("an ensemble has no Hugging Face form: export its models one at a time")
    if loaded.config.decode.precision == "int8":
        raise UsageError("this run was loaded for int8 decoding only and keeps no float weights; "
                         "export it without decode.precision=int8")
    if len(loaded.model.extensions):
        raise UsageError(f"the model extensions of its task ({', '.join(loaded.model.extensions)}) have no "
                         "place in a Hugging Face model")
    files = _files(loaded, codec, config)
    tensors = weights(loaded, codec, config)
    with new_directory(out) as scratch:
        for name, data in files.items():
            (scratch / name).write_bytes(data)
        write_safetensors(scratch / SAFETENSORS, tensors)
    return out
