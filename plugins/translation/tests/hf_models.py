"""Tiny Hugging Face models of the BART family, built here with transformers (a test
dependency): NLLB (``m2m_100`` with NLLB's tokenizer), mBART-50 and BART, each with a
tokenizer trained on a few generated sentences and saved as transformers saves it
(``tokenizer.json`` and ``tokenizer_config.json``), random weights trained for a few
updates on word-by-word pairs so that outputs follow the input and end by themselves."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sentencepiece as spm
import torch
from marian_models import SOURCE_WORDS, TARGET_WORDS, _pairs, sentences

#: family -> (language codes, source language, target language); BART has none
LANGUAGES = {
    "nllb": (["eng_Latn", "deu_Latn", "fra_Latn"], "eng_Latn", "deu_Latn"),
    "mbart50": (["en_XX", "de_DE", "fr_XX"], "en_XX", "de_DE"),
    "bart": ([], None, None),
}


def _texts() -> list[str]:
    return sentences(SOURCE_WORDS, 200, 1) + sentences(TARGET_WORDS, 200, 2)


def _sentencepiece_bpe(directory: Path) -> None:
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(_texts()), model_writer=buffer, vocab_size=80,
                                   model_type="bpe", character_coverage=1.0, hard_vocab_limit=False,
                                   minloglevel=2)
    (directory / "sentencepiece.bpe.model").write_bytes(buffer.getvalue())


def edit_config(**changes: object) -> Callable[[Path], None]:
    """A damage for a bad-input test: ``config.json``'s fields set to ``changes``."""
    def edit(directory: Path) -> None:
        path = directory / "config.json"
        config = json.loads(path.read_text(encoding="utf-8"))
        config.update(changes)
        path.write_text(json.dumps(config), encoding="utf-8")

    return edit


def tokenizer(family: str, directory: Path) -> Any:
    """The family's transformers tokenizer, trained here and saved into ``directory``."""
    import transformers
    from tokenizers import ByteLevelBPETokenizer

    directory.mkdir(parents=True, exist_ok=True)
    codes, source, target = LANGUAGES[family]
    if family == "bart":
        trained = ByteLevelBPETokenizer()
        trained.train_from_iterator(_texts(), vocab_size=300, min_frequency=1,
                                    special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
        model = json.loads(trained.to_str())["model"]
        merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in model["merges"]]
        tok = transformers.BartTokenizer(vocab=model["vocab"], merges=merges)
    else:
        scratch = directory / "spm"
        scratch.mkdir(exist_ok=True)
        _sentencepiece_bpe(scratch)
        cls = transformers.NllbTokenizer if family == "nllb" else transformers.MBart50Tokenizer
        tok = cls.from_pretrained(scratch, extra_special_tokens=codes, src_lang=source, tgt_lang=target)
        (scratch / "sentencepiece.bpe.model").unlink()
        scratch.rmdir()
    tok.save_pretrained(directory)
    return tok


def hf_directory(family: str, directory: Path, *, seed: int = 0, d_model: int = 32, layers: int = 2,
                 train_steps: int = 100, **config: Any) -> Path:
    """Write a tiny model of ``family`` (nllb, mbart50, bart) with its tokenizer into ``directory``."""
    import transformers

    tok = tokenizer(family, directory)
    vocab_size = len(tok) + 3  # rows no token has, as real models pad their matrices
    common: dict[str, Any] = {
        "vocab_size": vocab_size, "d_model": d_model, "encoder_layers": layers, "decoder_layers": layers,
        "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 2 * d_model,
        "decoder_ffn_dim": 2 * d_model, "max_position_embeddings": 64, "dropout": 0.0,
        "attention_dropout": 0.0, "activation_dropout": 0.0, "pad_token_id": tok.pad_token_id,
        "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id,
        "decoder_start_token_id": tok.eos_token_id,
    }
    torch.manual_seed(seed)
    if family == "nllb":
        hf_config = transformers.M2M100Config(**common, scale_embedding=True, activation_function="relu",
                                              **config)
        model = transformers.M2M100ForConditionalGeneration(hf_config)
    elif family == "mbart50":
        hf_config = transformers.MBartConfig(**common, scale_embedding=True, activation_function="gelu",
                                             **config)
        model = transformers.MBartForConditionalGeneration(hf_config)
    else:
        hf_config = transformers.BartConfig(**common, forced_bos_token_id=tok.bos_token_id,
                                            activation_function="gelu", **config)
        model = transformers.BartForConditionalGeneration(hf_config)
    if hasattr(model, "final_logits_bias"):
        with torch.no_grad():
            model.final_logits_bias.normal_(0.0, 0.5)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest, and kind to a busy machine
    try:
        train_briefly(model, tok, train_steps, _pairs(32, seed + 3))
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(directory)
    return directory


def train_briefly(model: Any, tok: Any, steps: int, pairs: tuple[list[str], list[str]]) -> None:
    """``steps`` Adam updates at lr 1e-2 of a transformers model on ``pairs`` (sources,
    targets), all in one batch: enough for a tiny model's outputs to follow the input."""
    if steps:
        sources, targets = pairs
        batch = tok(sources, text_target=targets, return_tensors="pt", padding=True)
        batch["labels"] = batch["labels"].masked_fill(batch["labels"].eq(tok.pad_token_id), -100)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        model.train()
        for _ in range(steps):
            optimizer.zero_grad()
            model(**batch).loss.backward()
            optimizer.step()
        model.eval()


def our_ids(loaded: Any, texts: list[str], *, target: bool = False) -> list[list[int]]:
    """seqtrans ids of ``texts`` through an imported run's codec (no end symbol)."""
    codec, vocab = loaded.codec, loaded.codec.vocabularies.source
    return [vocab.encode(codec.target_tokens(t) if target else codec.source_tokens(t)) for t in texts]


def model_ids(loaded: Any, rows: list[list[int]]) -> list[list[int]]:
    """The imported model's own ids of seqtrans ids."""
    symbols = loaded.codec.vocabularies.source.symbols
    return [loaded.codec.ids.ids_of([symbols[i] for i in row]) for row in rows]


def assert_log_probabilities_match(loaded: Any, hf: Any, sources: list[str], targets: list[str]) -> None:
    """Teacher-forced log-probabilities of the imported run within 1e-4 of the model's in
    transformers, at every position of every target; seqtrans's ``<s>`` takes none."""
    from seqtrans.data.batches import pad_batch  # internal: batches fed to both models, as the engine pads
    from seqtrans.plugin import BOS, EOS

    src = [[*s, EOS] for s in our_ids(loaded, sources)]
    tgt = our_ids(loaded, targets, target=True)
    pad = hf.config.pad_token_id
    with torch.no_grad():
        logits = loaded.model(pad_batch(src), pad_batch(tgt, before=BOS))
        ours = torch.log_softmax(logits, dim=-1)  # [B, T, V+1]
        src_hf = pad_batch(model_ids(loaded, src), pad=pad)
        tgt_hf = pad_batch(model_ids(loaded, [[BOS, *t] for t in tgt]), pad=pad)  # <s>: the decoder start
        theirs = torch.log_softmax(hf(input_ids=src_hf, attention_mask=src_hf.ne(pad),
                                      decoder_input_ids=tgt_hf).logits, dim=-1)  # [B, T, V]
    order = torch.tensor(loaded.codec.ids.hf_ids)
    keep = torch.ones(order.numel(), dtype=torch.bool)
    keep[BOS] = False  # seqtrans's <s> repeats the decoder start's row
    for b, t in enumerate(tgt):
        n = len(t) + 1  # <s> y -> y </s>
        diff = (ours[b, :n, keep] - theirs[b, :n, order[keep]]).abs().max().item()
        assert diff <= 1e-4, f"sentence {b}: log-probabilities differ by {diff}"
        assert ours[b, :n, BOS].max().item() < -90  # e^-90 of the mass: none


#: An imported NLLB model's languages, as decoding settings.
NLLB_LANGUAGES = ["decode.source_lang=eng_Latn", "decode.target_lang=deu_Latn"]


def imported_nllb(tmp_path_factory: Any) -> Path:
    """A run imported from a tiny NLLB model (:func:`hf_directory`), in a new temporary directory."""
    from seqtrans_translation.hf import FORMAT as HF_FORMAT

    base = tmp_path_factory.mktemp("nllb")
    return Path(HF_FORMAT.import_model(hf_directory("nllb", base / "hf"), out=base / "run"))
