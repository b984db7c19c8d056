"""The model-extension seam (seqtrans.model.extension): the plugin reference's example extension,
run as the guide shows it, against teacher forcing, brute-force search, ensembles and a
save-and-load; what the engine refuses and how it names the extension."""

from __future__ import annotations

import functools
import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from counting_extension import CountingExtension
from test_search import wide_beam_is_exact

from conftest import tiny_model
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import BOS, EOS
from seqtrans.decoding import beam_search
from seqtrans.decoding.ensemble import Ensemble
from seqtrans.model.extension import ExtensionError, ModelExtension
from seqtrans.model.transformer import Transformer

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "plugin-abilities.md"


@functools.cache
def guide_example() -> dict[str, Any]:
    """The guide's example extension module, executed as written (registered as a module:
    dataclasses look their module up)."""
    blocks = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.DOTALL)
    [code] = [b for b in blocks if "class RemainingLength(ModelExtension)" in b]
    module = types.ModuleType("guide_example")
    sys.modules[module.__name__] = module
    exec(compile(code, str(GUIDE), "exec"), module.__dict__)
    return module.__dict__


def with_countdown(seed: int, **options: Any) -> Transformer:
    model = tiny_model(vocab=7, seed=seed, **options)
    model.extend({"countdown": guide_example()["RemainingLength"](model.config.d_model, most=4)})
    return model.eval()


def test_the_guides_extension_adds_the_same_step_by_step_as_teacher_forced() -> None:
    model = with_countdown(0)
    src = pad_batch([[4, 5, 6, EOS], [6, EOS]])  # [2, 4]
    tgt = pad_batch([[BOS, 4, 4, 5, 6, 6, 5], [BOS, 6, 5, 4, 4, 5, 5]])  # [2, 7]
    with torch.no_grad():
        encoded = model.encode(src)
        assert encoded.context["countdown"].tolist() == [4, 2]
        whole = model.decode(tgt, encoded)
        state = model.start(encoded, capacity=2)
        steps = [model.decode(tgt[:, :3], state=state), *(model.decode(tgt[:, t:t + 1], state=state)
                                                           for t in range(3, tgt.size(1)))]
        torch.testing.assert_close(torch.cat(steps, 1), whole, atol=1e-5, rtol=1e-5)
        # it changes what the model computes
        plain = tiny_model(vocab=7, seed=0)
        assert not torch.allclose(plain.decode(tgt, plain.encode(src)), whole)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_wide_beam_with_the_guides_extension_is_the_brute_force_argmax(seed: int) -> None:
    """Its state follows the beam's reorders: search finds what enumerating every output finds."""
    with torch.no_grad():
        wide_beam_is_exact(with_countdown(seed), 0.6)


def test_extensions_ride_along_in_ensembles_saves_and_int8_copies(tmp_path: Path) -> None:
    src = pad_batch([[4, 5, EOS], [6, 4, 5, 6, EOS]])
    max_len = torch.tensor([6, 6])
    with torch.no_grad():
        extended = with_countdown(2)
        alone = beam_search(extended, src, beam=3, alpha=0.6, max_len=max_len, nbest=3)
        twice = beam_search(Ensemble([extended, extended]), src, beam=3, alpha=0.6, max_len=max_len, nbest=3)
        assert [[h.tokens for h in hs] for hs in alone] == [[h.tokens for h in hs] for hs in twice]
        mixed = Ensemble([extended, tiny_model(vocab=7, seed=3, extension=True)])
        assert len(beam_search(mixed, src, beam=3, alpha=0.6, max_len=max_len, nbest=1)) == 2
        # saved with the model, under its name
        state = extended.state_dict()
        assert "extensions.countdown.table.weight" in state
        again = with_countdown(5)
        again.load_state_dict(state)
        torch.testing.assert_close(again(src, src), extended(src, src))
        from seqtrans.linear.quantize import quantized

        int8 = quantized(extended)
        assert isinstance(int8.extensions["countdown"], ModelExtension)
        assert beam_search(int8, src, beam=3, alpha=0.6, max_len=max_len, nbest=1)


def test_what_an_extension_cannot_do_is_refused_with_its_name_and_reason() -> None:
    model = with_countdown(0, cross_attention="monotonic", causal_encoder=True)
    with pytest.raises(ExtensionError, match=r"streaming \(predict --stream\) is not possible with this "
                                             r"model: its task's model extension 'countdown' "
                                             r"\(RemainingLength\) needs the source's length"):
        model.check_supported("stream")
    with pytest.raises(ExtensionError, match="'countdown' .* the export format has no place for"):
        model.check_supported("export")
    model.check_supported("quantize")
    model.check_supported("ensemble")

    class Alone(ModelExtension):
        limits = {"ensemble": "keeps one state for every model", "stream": ""}  # "": it streams

    lonely = tiny_model(vocab=7)
    lonely.extend({"alone": Alone()})
    lonely.check_supported("stream")
    with pytest.raises(ExtensionError, match="decoding it in an ensemble .* 'alone' .* keeps one state"):
        Ensemble([lonely, tiny_model(vocab=7)])
    Ensemble([lonely])  # one model is no ensemble


def test_extend_takes_named_extensions_only() -> None:
    model = tiny_model()
    with pytest.raises(TypeError, match="'bad' is a Linear, not a seqtrans.model.extension.ModelExtension"):
        model.extend({"bad": torch.nn.Linear(2, 2)})  # type: ignore[dict-item]
    model.extend({"counting": CountingExtension(16)})
    with pytest.raises(ValueError, match="'counting' is not an identifier or is taken"):
        model.extend({"counting": CountingExtension(16)})
    with pytest.raises(ValueError, match="'a.b' is not an identifier"):
        model.extend({"a.b": CountingExtension(16)})
    assert [name for name, _ in model.named_extensions()] == ["counting"]
