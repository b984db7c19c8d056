"""``seqtrans import hf`` on damaged T5 directories: each is refused with a message naming
the file and the field or tensor, and nothing is written. ByT5's byte tokenizer against
transformers' on text no model writes (invalid UTF-8, special tokens), and on a ByT5
directory as the Hub keeps them (the tokenizer named in ``config.json`` alone); the
relative position buckets against transformers'."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hf_models import edit_config
from t5_models import EXTRA_IDS, t5_directory

from seqtrans import load
from seqtrans.model.relative import relative_buckets  # internal: the buckets compared with transformers'
from seqtrans.plugin import DataError
from seqtrans_translation.hf import FORMAT as HF_FORMAT
from seqtrans_translation.hf.codec import ByteTokenizer

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def t5(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return t5_directory("t5", tmp_path_factory.mktemp("t5") / "hf", train_steps=0)


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "no tokenizer": (lambda d: (d / "tokenizer.json").unlink(),
                     r"tokenizer\.json: missing: a T5 model's tokenizer is read from its tokenizer\.json or "
                     r"spiece\.model"),
    "wrong shape": (edit_config(relative_attention_num_buckets=16),
                    r"model\.safetensors: tensor 'encoder\.block\.0\.layer\.0\.SelfAttention\."
                    r"relative_attention_bias\.weight' has shape \(8, 4\), but config\.json implies "
                    r"\(16, 4\)"),
    "feed-forward": (edit_config(feed_forward_proj="gated-gelu-x"),
                     r"config\.json: field 'feed_forward_proj' is 'gated-gelu-x': not ACT or gated-ACT"),
    "no head": (edit_config(tie_word_embeddings=False),
                r"config\.json: field 'tie_word_embeddings' is False: .* no 'lm_head\.weight'"),
    "no heads": (edit_config(d_kv=0), r"config\.json: field 'd_kv' is 0: must be at least 1"),
    "no model": (edit_config(relative_attention_max_distance=2),
                 r"config\.json: does not make a seqtrans model: .*model\.relative_max_distance"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_directories_are_refused_naming_what_is_wrong(t5: Path, tmp_path: Path, case: str) -> None:
    damage, message = CASES[case]
    directory = tmp_path / "hf"
    shutil.copytree(t5, directory)
    damage(directory)
    with pytest.raises(DataError, match=message):
        HF_FORMAT.import_model(directory, out=tmp_path / "runs" / "run")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_byte_tokens_are_those_of_byt5() -> None:
    """Bytes on the way in; on the way out, special tokens and bytes that are not UTF-8
    left out as ``ByT5Tokenizer.decode`` leaves them."""
    theirs = transformers.ByT5Tokenizer(extra_ids=EXTRA_IDS)
    added = {f"<extra_id_{i}>": theirs.convert_tokens_to_ids(f"<extra_id_{i}>") for i in range(EXTRA_IDS)}
    ours = ByteTokenizer(added)
    for text in ("läuft", "a\tb\n c  ", "日本語 ✓ 🙂", ""):
        assert ours.encode(text) + [1] == theirs(text)["input_ids"]
    e_acute = [0xC3 + 3, 0xA9 + 3]  # é
    cases = [e_acute, e_acute[:1], e_acute[1:] + e_acute, [e_acute[0], 1, e_acute[1]],
             [e_acute[0], added["<extra_id_0>"], e_acute[1], 0, 2], [104 + 3, 0xF0 + 3, 0x9F + 3, 105 + 3],
             [0, 1, 2], list(range(3, 259))]
    for ids in cases:
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True), ids
    assert ours.token_to_id("<extra_id_0>") == theirs.convert_tokens_to_ids("<extra_id_0>")
    assert ours.tokens() == {0: "<pad>", 1: "</s>", 2: "<unk>", **{i: t for t, i in added.items()}}


def test_a_byt5_directory_named_only_in_its_config_imports_with_its_sentinels(tmp_path: Path) -> None:
    """The Hub's ByT5 directories name ByT5Tokenizer in config.json and list no added
    tokens: the sentinels follow the bytes, <extra_id_0> first, as transformers has them."""
    directory = t5_directory("byt5", tmp_path / "hf", train_steps=0)
    expected = load(HF_FORMAT.import_model(directory, out=tmp_path / "run"), device="cpu")
    (directory / "added_tokens.json").unlink(missing_ok=True)
    path = directory / "tokenizer_config.json"
    settings = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({"extra_ids": EXTRA_IDS, "eos_token": "</s>"}), encoding="utf-8")
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    config["tokenizer_class"] = settings["tokenizer_class"]
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    again = load(HF_FORMAT.import_model(directory, out=tmp_path / "again"), device="cpu")
    symbols = again.codec.vocabularies.source.symbols
    assert symbols == expected.codec.vocabularies.source.symbols
    assert symbols.index("<extra_id_0>") < symbols.index(f"<extra_id_{EXTRA_IDS - 1}>")
    assert again.codec.source_tokens("läuft") == expected.codec.source_tokens("läuft")


@pytest.mark.parametrize("buckets, max_distance", [(32, 128), (8, 20)])
@pytest.mark.parametrize("bidirectional", [True, False])
def test_relative_buckets_are_those_of_transformers(buckets: int, max_distance: int,
                                                    bidirectional: bool) -> None:
    from transformers.models.t5.modeling_t5 import T5Attention

    relative = torch.arange(-400, 401)
    theirs = T5Attention._relative_position_bucket(relative, bidirectional=bidirectional, num_buckets=buckets,
                                                   max_distance=max_distance)
    ours = relative_buckets(relative, bidirectional=bidirectional, buckets=buckets, max_distance=max_distance)
    assert torch.equal(ours, theirs)
