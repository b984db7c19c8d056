"""``seqtrans export RUN_DIR --to hf OUT``: a model imported with ``seqtrans import hf``,
fine-tuned or not, written back as the Hugging Face model directory it came from, which
``from_pretrained`` loads: its own ``config.json``, ``generation_config.json``,
``tokenizer_config.json`` and ``tokenizer.json``, and the weights as
``model.safetensors``, renamed and reordered as :mod:`.bart` reads them, backwards.

The model's rows come back from seqtrans's symbols: each of the model's ids takes the
row of the symbol that names it. seqtrans's ``<s>`` is a copy of the model's decoder
start row (:mod:`.vocabulary`), which fine-tuning may have moved away from the row of
the same id's own symbol (``</s>`` for the BART family): the model has one row where
seqtrans has two, and the exported row is that of ``</s>``. What the format has no
place for is refused before anything is written: an output bias that fine-tuning
trained in a family without one (M2M-100, NLLB), an ensemble, an int8-only model.

Shapes: V the model's vocabulary, V' = V + 1 seqtrans's, D d_model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from seqtrans.data.vocab import BOS
from seqtrans.errors import UsageError
from seqtrans.runtime import atomic
from seqtrans_translation.hf import bart
from seqtrans_translation.hf.codec import HFCodec
from seqtrans_translation.hf_marian.tensors import SAFETENSORS, write_safetensors

if TYPE_CHECKING:
    from seqtrans.inference.loading import Loaded


def _rows_back(table: Tensor, hf_ids: tuple[int, ...], size: int) -> Tensor:
    """The model's table [V, ...] from seqtrans's [V', ...]: each id takes the row of the
    first symbol naming it, ``<s>`` last (a copy of the decoder start's row)."""
    source: dict[int, int] = {}
    for ours, theirs in enumerate(hf_ids):
        if ours != BOS:
            source.setdefault(theirs, ours)
    source.setdefault(hf_ids[BOS], BOS)
    index = torch.tensor([source[i] for i in range(size)])  # [V]
    return table.index_select(0, index).contiguous()


def weights(loaded: Loaded, codec: HFCodec, config: dict[str, object]) -> dict[str, Tensor]:
    """The model's tensors by its own names."""
    c = loaded.config.model
    state = {k: v.detach().float().cpu() for k, v in loaded.model.state_dict().items()}
    size = int(config["vocab_size"])  # type: ignore[call-overload]
    hf_ids = codec.ids.hf_ids
    out = {"model.shared.weight": _rows_back(state["target_embed.weight"], hf_ids, size)}
    if not c.tie_output:
        out["lm_head.weight"] = _rows_back(state["output.weight"], hf_ids, size)
    bias = state["output_bias"].clone()
    bias[BOS] = 0.0  # seqtrans's own absent <s>, not the model's
    if config["model_type"] == "m2m_100":
        if bias.abs().max() > 0:
            raise UsageError("the model's output bias has changed (fine-tuning trains it), and M2M-100 and "
                             "NLLB models have no place for one: it cannot be exported without changing "
                             "the outputs")
    else:
        out["final_logits_bias"] = _rows_back(bias, hf_ids, size).unsqueeze(0)  # [1, V]
    for ours, parts in bart.key_map(c):
        sizes = [shape[0] for _, shape in parts]
        for (name, _), piece in zip(parts, state[ours].split(sizes)):
            out[name] = piece.contiguous()
    return out


def export_hf(loaded: Loaded, *, out: Path) -> Path:
    """Write ``loaded`` as the Hugging Face model directory ``out``, whole or not at all."""
    codec = loaded.codec
    if not isinstance(codec, HFCodec) or "config.json" not in dict(codec.originals):
        raise UsageError("--to hf writes models imported with 'seqtrans import hf' (their config.json is "
                         "kept with them); a model trained here exports with --to hf-marian or --to "
                         "ctranslate2")
    originals = dict(codec.originals)
    config = json.loads(originals["config.json"])
    if config.get("model_type") not in bart.MODEL_TYPES:
        raise UsageError(f"--to hf does not write model_type {config.get('model_type')!r} yet (it writes "
                         f"{', '.join(bart.MODEL_TYPES)})")
    if loaded.others:
        raise UsageError("an ensemble has no Hugging Face form: export its models one at a time")
    if loaded.config.decode.precision == "int8":
        raise UsageError("this run was loaded for int8 decoding only and keeps no float weights; "
                         "export it without decode.precision=int8")
    tensors = weights(loaded, codec, config)
    with atomic.new_directory(out) as scratch:
        for name, data in originals.items():
            (scratch / name).write_bytes(data)
        (scratch / "tokenizer.json").write_bytes(codec.tokenizer_json)
        write_safetensors(scratch / SAFETENSORS, tensors)
    return out

