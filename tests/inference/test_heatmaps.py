"""`seqtrans attention`: heatmaps of a trained model's attention on one input."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from test_inference import TINY_COPY_RUN

from conftest import src_batch, tiny_model
from seqtrans.cli import main
from seqtrans.data.vocab import BOS
from seqtrans.inference.heatmaps import Attended, attend, draw
from seqtrans.inference.loading import load
from seqtrans.model.transformer import attention_maps

PNG = b"\x89PNG\r\n\x1a\n"
TINY = [*TINY_COPY_RUN, "model.decoder_layers=2"]  # a grid of more than one layer


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("attention") / "run"
    assert main(["-q", "run", "copy", "--out", str(out), "--device", "cpu", "--set", *TINY]) == 0
    return out


def test_the_command_writes_a_png_per_stack(run_dir: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "maps"
    assert main(["-q", "attention", str(run_dir), "3 1 4", "--out", str(out), "--device", "cpu"]) == 0
    names = ["encoder.png", "decoder.png", "cross.png"]
    assert capsys.readouterr().out.split() == [w for n in names for w in ("wrote", str(out / n))]
    for name in names:
        assert (out / name).read_bytes().startswith(PNG)
    assert sorted(p.name for p in out.iterdir()) == sorted(names)  # no temporary file left
    # layer 2 is only the decoder's: no encoder picture
    assert main(["-q", "attention", str(run_dir), "3 1 4", "--target", "3 1 4", "--layers", "2"]) == 0
    assert sorted(p.name for p in (run_dir / "attention").iterdir()) == ["cross.png", "decoder.png"]
    # a checkpoint of the run draws into the run directory too, not beside the checkpoints
    shutil.rmtree(run_dir / "attention")
    average = run_dir / "checkpoints" / "average.pt"
    assert main(["-q", "attention", str(average), "3 1 4", "--layers", "2"]) == 0
    assert sorted(p.name for p in (run_dir / "attention").iterdir()) == ["cross.png", "decoder.png"]
    assert not (run_dir / "checkpoints" / "attention").exists()


def test_the_maps_are_labelled_with_the_tokens_they_are_of(run_dir: Path) -> None:
    loaded = load(run_dir, device="cpu")
    seen = attend(loaded, "3 1 4", target="3 1 4 1")
    eos = loaded.codec.vocabularies.target.symbols[2]
    assert seen.source == ["3", "1", "4", eos]
    assert seen.inputs == [loaded.codec.vocabularies.target.symbols[BOS], "3", "1", "4", "1"]
    assert seen.outputs == ["3", "1", "4", "1", eos]
    assert seen.maps.encoder[0].shape == (1, 2, 4, 4)
    assert seen.maps.decoder[1].shape == (1, 2, 5, 5)
    assert seen.maps.cross[1].shape == (1, 2, 5, 4)  # type: ignore[union-attr]
    decoded = attend(loaded, "3 1 4")  # on the model's own output
    _, hyps = loaded.decode([loaded.task.parse_source("3 1 4")])
    assert decoded.outputs[:-1] == [loaded.codec.vocabularies.target.symbols[i] for i in hyps[0][0].tokens]


@pytest.mark.parametrize(("args", "status", "words"), [
    (["  "], 2, "the input is empty"),
    (["3 " * 100], 2, "at most 100 can be drawn"),
    (["3 1", "--layers", "1", "3"], 2, "the model has 1 encoder and 2 decoder layers, not 3"),
    (["3 1", "--target", "3 x"], 2, "not in the model's target vocabulary: 'x'"),
])
def test_bad_requests_are_clear_errors(run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       args: list[str], status: int, words: str) -> None:
    assert main(["-q", "attention", str(run_dir), *args, "--out", str(tmp_path), "--device", "cpu"]) == status
    assert words in capsys.readouterr().err


def test_a_directory_without_a_model_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-q", "attention", str(tmp_path), "3 1"]) == 1
    assert "neither a checkpoint file nor a run directory with checkpoints" in capsys.readouterr().err


def test_without_matplotlib_the_error_names_the_extra(run_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert main(["-q", "attention", str(run_dir), "3 1", "--device", "cpu"]) == 2
    assert "pip install 'seqtrans[plot]'" in capsys.readouterr().err


@pytest.mark.parametrize("options", [{"cross_attention": "memory", "memory_slots": 3},
                                     {"cross_attention": "monotonic", "monotonic_r_init": 0.3},
                                     {"cross_attention": "mma_il", "monotonic_r_init": 0.3}])
def test_memory_and_monotonic_attention_are_drawn(options: dict[str, Any], tmp_path: Path) -> None:
    model = tiny_model(**options)
    src, tgt = src_batch()[:1], torch.tensor([[BOS, 5, 6, 7]])
    maps = attention_maps(model, src, tgt)
    seen = Attended(list("abcde"), ["<s>", "x", "y", "z"], ["x", "y", "z", "</s>"], maps)
    for path in draw(seen, tmp_path):
        assert path.read_bytes().startswith(PNG)
