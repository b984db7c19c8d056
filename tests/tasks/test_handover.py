"""A run that keeps another task's codec (``seqtrans.tasks.handover``): which pairs of
tasks may, the vocabulary files that record it, and the codec made from them alone. The
copy task stands for both sides here: its text form round-trips through its own codec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seqtrans.config import to_dict
from seqtrans.data.assets import read_assets, write_assets
from seqtrans.errors import DataError
from seqtrans.tasks import handover
from seqtrans_copy import CopyConfig, CopyTask


def test_a_pair_of_tasks_is_refused_by_the_abilities_either_lacks() -> None:
    assert handover.problems("copy", "translation") == []
    (problem,) = handover.problems("parsing", "translation")
    assert "task 'parsing' has no text form" in problem and "TextForm" in problem


def _files(tmp_path: Path) -> Path:
    model_task = CopyTask(CopyConfig(vocab_size=7))
    (tmp_path / "model").mkdir()
    model_task.build_vocabulary(tmp_path / "model", [])
    assets = handover.files(read_assets(tmp_path / "model"), model_task="copy",
                            model_data=to_dict(model_task.config))
    write_assets(tmp_path / "run", assets)
    return tmp_path / "run"


def test_the_codec_is_made_from_the_files_through_the_runs_text_form(tmp_path: Path) -> None:
    directory = _files(tmp_path)
    assert json.loads((directory / handover.FILE).read_text())["task"] == "copy"
    codec = handover.load_codec(CopyTask(CopyConfig(vocab_size=3)), directory)
    assert isinstance(codec, handover.TextCodec)
    assert len(codec.vocabularies.target) == 4 + 7  # the model's vocabulary, not the run's
    assert codec.source_tokens([6, 0]) == codec.target_tokens([6, 0]) == ["6", "0"]
    assert codec.prediction(["5", "<unk>", "1"], [1]) == [5, -1, 1]  # the model's text, read back
    assert codec.target_prefix() == []


def test_files_without_the_record_are_the_tasks_own(tmp_path: Path) -> None:
    task = CopyTask(CopyConfig())
    task.build_vocabulary(tmp_path, [])
    assert not isinstance(handover.load_codec(task, tmp_path), handover.TextCodec)


def test_a_damaged_record_is_an_error_naming_the_file(tmp_path: Path) -> None:
    directory = _files(tmp_path)
    (directory / handover.FILE).write_text("{", encoding="utf-8")
    with pytest.raises(DataError, match=handover.FILE):
        handover.load_codec(CopyTask(CopyConfig()), directory)
