"""``seqtrans import hf DIR --out RUN_DIR``: a local Hugging Face model directory read as
a seqtrans translation run. ``config.json``'s ``model_type`` names the family; each
family's module reads its config into seqtrans model options and renames its tensors
(:mod:`.bart`, :mod:`.t5`; Marian models go through :mod:`seqtrans_translation.hf_marian`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from torch import Tensor

from seqtrans.plugin import DataError, ModelConfig, RunConfig, from_dict, merge, to_dict, write_run
from seqtrans_translation.config import TranslationConfig
from seqtrans_translation.hf import bart, t5
from seqtrans_translation.hf.codec import (
    ORIGINALS,
    TOKENIZER,
    TOKENIZER_CONFIG,
    TOKENIZER_FILES,
    HFCodec,
    Layout,
    TextTokenizer,
    make_tokenizer,
)
from seqtrans_translation.hf.directory import CONFIG, GENERATION_CONFIG, Settings, read_json, weights
from seqtrans_translation.hf.vocabulary import IdMap, id_map
from seqtrans_translation.presets import DEFAULTS

log = logging.getLogger(__name__)

SUPPORTED = ("marian", *bart.MODEL_TYPES, *t5.MODEL_TYPES)
_ROLES = ("<s>", "</s>", "<pad>", "<unk>", "<mask>")


def _settings(path: Path, *, what: str, required: bool = True) -> Settings:
    if not required and not path.is_file():
        return Settings({}, path)
    return Settings(read_json(path, what=what), path)


def _languages(tokenizer_config: Settings, tokenizer: Any) -> tuple[str, ...]:
    listed = tokenizer_config.values.get("extra_special_tokens") or \
        tokenizer_config.values.get("additional_special_tokens") or []
    if isinstance(listed, dict):  # transformers 5 may keep named extra tokens
        listed = list(listed.values())
    codes = [t if isinstance(t, str) else t.get("content") for t in listed]
    return tuple(c for c in codes
                 if isinstance(c, str) and c not in _ROLES and tokenizer.token_to_id(c) is not None)


def _id_map(s: Settings, tokenizer: TextTokenizer, generation: Settings) -> IdMap:
    size = s.get("vocab_size", int)
    tokens = tokenizer.tokens()
    over = [i for i in tokens if not 0 <= i < size]
    if over:
        raise DataError(Path(TOKENIZER), None, f"token id {max(over)} is beyond config.json's vocab_size "
                                               f"{size}: the tokenizer does not belong to this model")
    unk = tokenizer.token_to_id("<unk>")
    if unk is None:
        raise DataError(Path(TOKENIZER), None, "has no '<unk>' token")
    start = generation.optional("decoder_start_token_id", int)
    start = s.optional("decoder_start_token_id", int) if start is None else start
    if start is None and s.get("model_type", str) in t5.MODEL_TYPES:
        start = s.get("pad_token_id", int)  # T5 starts from its padding id
    start = s.get("decoder_start_token_id", int) if start is None else start
    return id_map(tokens, size=size, pad=s.get("pad_token_id", int), eos=s.get("eos_token_id", int), unk=unk,
                  start=start)


def run_config(model: ModelConfig, generation: Settings) -> RunConfig:
    """The run config of an imported model: the model's options, the task's decoding
    defaults (the beam of generation_config.json where it has one), no data."""
    tree = merge({}, DEFAULTS)
    beams = generation.optional("num_beams", int)
    if beams is not None and beams >= 1:
        tree = merge(tree, {"decode": {"beam": beams}})
    tree = merge(tree, {"task": "translation", "model": to_dict(model), "data": {"dataset": "none"}})
    return from_dict(RunConfig, tree, data_cls=TranslationConfig)


def read_model(directory: Path, *, allow_pickle: bool = False,
               ) -> tuple[RunConfig, HFCodec, dict[str, Tensor]]:
    """The run config, codec and weights of the model in ``directory``."""
    s = _settings(directory / CONFIG, what="a Hugging Face model directory has config.json")
    kind = s.get("model_type", str)
    if kind not in bart.MODEL_TYPES + t5.MODEL_TYPES:
        raise s.fail("model_type", f"not a family seqtrans imports (it imports {', '.join(SUPPORTED)})")
    family = t5 if kind in t5.MODEL_TYPES else bart
    generation = _settings(directory / GENERATION_CONFIG, what="", required=False)
    tokenizer_config = _settings(directory / TOKENIZER_CONFIG, what="", required=False)
    path = directory / TOKENIZER
    tokenizer_kind, added = "tokenizers", dict[str, int]()
    if family is t5:
        tokenizer_kind, data, added = t5.tokenizer_of(directory, s, tokenizer_config)
    elif not path.is_file():
        raise DataError(path, None, "missing: the model's tokenizer is read from its tokenizer.json")
    else:
        data = path.read_bytes()
    origin = directory / (TOKENIZER_FILES[tokenizer_kind] or TOKENIZER_CONFIG)
    tokenizer = make_tokenizer(tokenizer_kind, data, added, origin)
    ids = _id_map(s, tokenizer, generation)
    languages = _languages(tokenizer_config, tokenizer)
    source_prefix, target_prefix = family.layout_of(s, tokenizer_config, languages)
    multilingual = any("{" in t for t in source_prefix + target_prefix)
    layout = Layout(source_prefix, target_prefix, languages if multilingual else (),
                    tokenizer_config.optional("src_lang", str), tokenizer_config.optional("tgt_lang", str),
                    bool(tokenizer_config.values.get("clean_up_tokenization_spaces", False)))
    originals = tuple((name, (directory / name).read_bytes()) for name in ORIGINALS
                      if (directory / name).is_file())
    del tokenizer  # the codec parses its own: a 256,206-word tokenizer holds hundreds of MB
    codec = HFCodec(data, ids, layout, originals, tokenizer_kind, tuple(added.items()))
    w = weights(directory, allow_pickle=allow_pickle)
    model = t5.model_config(s, w) if family is t5 else bart.model_config(s)
    state = family.state_dict(w, model, ids.order, vocab_size=s.get("vocab_size", int))
    unused = sorted(set(w.names()) - w.taken - {"lm_head.weight"})
    if unused:
        log.warning("%s: %d tensors not used (%s ...)", directory, len(unused), ", ".join(unused[:3]))
    return run_config(model, generation), codec, state


def import_hf(directory: Path, *, out: Path, allow_pickle: bool = False) -> Path:
    """Write the model of ``directory`` as the seqtrans run directory ``out``, whole or
    not at all (written beside it, then renamed)."""
    directory, out = Path(directory), Path(out)
    if not directory.is_dir():
        raise DataError(directory, None, "not a directory")
    if out.exists():
        raise DataError(out, None, "exists; remove it or choose another run directory")
    s = _settings(directory / CONFIG, what="a Hugging Face model directory has config.json")
    if s.get("model_type", str) == "marian":
        from seqtrans_translation.hf_marian.importing import import_marian

        return import_marian(directory, out=out, allow_pickle=allow_pickle)
    config, codec, state = read_model(directory, allow_pickle=allow_pickle)
    write_run(out, config, codec.files(), state, imported=f"hf {s.get('model_type', str)} {directory.name}")
    m = config.model
    log.info("imported %s (%s, %d symbols, %d+%d layers of width %d) as %s", directory,
             s.get("model_type", str), len(codec.ids.vocab), m.encoder_layers, m.decoder_layers, m.d_model,
             out)
    return out
