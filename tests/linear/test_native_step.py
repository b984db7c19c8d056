"""The decoder's layers in one native call per step (seqtrans.linear.native_step): the
same bits as the layers' own calls in every search and batch, the caches left as those
leave them, chosen by timing, and the PyTorch path kept wherever the step does not cover a
model or a step."""

from __future__ import annotations

import copy
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

from conftest import tiny_model
from seqtrans import native
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import EOS
from seqtrans.decoding import beam_search, greedy_search
from seqtrans.linear import native_step
from seqtrans.linear.onednn import onednn_available
from seqtrans.linear.quantize import int8_only, onednn, quantized
from seqtrans.model.norms import NativeLayerNorm
from seqtrans.model.transformer import Transformer
from seqtrans.runtime.timing import TimedChoice

pytestmark = pytest.mark.usefixtures("native_kernels", "no_grad")

#: T5's layers (pre-norm RMSNorm, a relative position bias, unscaled attention, no biases, a
#: ReLU feed-forward, a scaled output), small
T5_LIKE = {"norm": "pre", "norm_kind": "rms", "norm_eps": 1e-6, "positions": "relative",
           "relative_buckets": 8, "relative_max_distance": 12, "bias": False, "attention_scale": False,
           "scale_embeddings": False, "scale_output": True, "d_model": 32, "d_ff": 64}
POST_NORM_RMS = {"norm": "post", "norm_kind": "rms", "d_model": 32, "d_ff": 64}
#: the paper's layers with LayerNorm, before each sub-layer (a final LayerNorm) and after
PRE_NORM_LAYER = {"norm": "pre", "norm_kind": "layer", "d_model": 32, "d_ff": 64}
POST_NORM_LAYER = {"norm": "post", "norm_kind": "layer", "d_model": 32, "d_ff": 64}
#: feed-forward layers no kernel computes, which the step leaves to the layer: T5 v1.1's
#: gated GELU (Flan-T5, mT5, ByT5), BART's GELU after LayerNorm, Marian's SiLU
T5_GATED = {**T5_LIKE, "activation": "gelu_tanh", "gated_ffn": True}
BART_LIKE = {**POST_NORM_LAYER, "activation": "gelu"}
SILU_PRE_NORM = {"norm": "pre", "norm_kind": "layer", "activation": "silu", "d_model": 32, "d_ff": 64}


class _Always(dict):  # type: ignore[type-arg]
    """A table of choices that has already chosen ``way`` for every key."""

    def __init__(self, way: bool) -> None:
        super().__init__()
        self.way = way

    def get(self, key: Any, default: Any = None) -> TimedChoice[bool]:
        choice: TimedChoice[bool] = TimedChoice((True, False), trials=1)
        choice.chosen = self.way
        return choice


def require_float32_step() -> None:
    """Skip where float32 layers are not multiplied by oneDNN with a native kernel beside it
    (no AVX2 and FMA, or a PyTorch without oneDNN)."""
    if not (onednn_available() and native.decoder_step_available("float32")):
        pytest.skip("float32 decoding here has no packed native product")


def sources(count: int = 7, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return pad_batch([torch.randint(4, 40, (int(n),), generator=g).tolist() + [EOS]
                      for n in torch.randint(3, 10, (count,), generator=g)])


def outputs(search: Callable[[], list[Any]]) -> list[list[tuple[list[int], float]]]:
    return [[(list(h.tokens), float(h.score)) for h in hyps] for hyps in search()]


def run_both(monkeypatch: pytest.MonkeyPatch, twin: Transformer, search: Callable[[Transformer], list[Any]],
             ) -> tuple[Any, Any, int]:
    """The search's outputs through the native step and through the layers, and how many
    native steps (or, with PyTorch's LayerNorm, sub-layers) ran."""
    calls = []
    real, sublayer = native.decoder_step, native.decoder_sublayer
    monkeypatch.setattr(native, "decoder_step", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(native, "decoder_sublayer", lambda *a: calls.append(1) or sublayer(*a))
    monkeypatch.setattr(native_step, "_choices", _Always(True))
    ours = outputs(lambda: search(twin))
    steps = len(calls)
    monkeypatch.setattr(native_step, "_choices", _Always(False))
    theirs = outputs(lambda: search(twin))
    assert len(calls) == steps  # the layers' path calls no native step
    return ours, theirs, steps


@pytest.mark.parametrize("options", [T5_LIKE, POST_NORM_RMS, PRE_NORM_LAYER, POST_NORM_LAYER, T5_GATED,
                                     BART_LIKE, SILU_PRE_NORM],
                         ids=["pre-norm-t5", "post-norm", "pre-norm-layer-norm", "post-norm-layer-norm",
                              "gated-gelu-t5", "gelu-post-norm", "silu-pre-norm"])
@pytest.mark.parametrize("make", [quantized, int8_only, onednn], ids=["quantized", "int8-only", "float32"])
def test_the_native_step_gives_the_layers_bits_in_beam_and_greedy_search(
        monkeypatch: pytest.MonkeyPatch, options: dict[str, Any],
        make: Callable[[Transformer], Transformer]) -> None:
    if make is onednn:
        require_float32_step()
    twin = make(tiny_model(vocab=40, seed=3, **options))
    assert isinstance(twin.native_step, native_step.NativeStep)
    src = sources()
    max_len = torch.tensor([9, 4, 12, 7, 9, 3, 10])  # sentences end at different steps
    beam = 4
    if make is onednn:  # float32 steps of up to 8 rows are the step's (onednn.NATIVE_ROWS)
        src, max_len, beam = src[:4], max_len[:4], 2
    for search in (lambda m: beam_search(m, src, beam=beam, alpha=0.6, max_len=max_len, nbest=2),
                   lambda m: greedy_search(m, src, max_len=max_len)):
        ours, theirs, steps = run_both(monkeypatch, twin, search)
        assert steps > 3
        assert ours == theirs  # tokens and scores, bit for bit
    # outputs that vary and end: a test of something
    lengths = {len(hyps[0][0]) for hyps in ours}
    assert len(lengths) > 2


@pytest.mark.parametrize("make,options",
                         [(quantized, T5_LIKE), (onednn, T5_LIKE), (quantized, PRE_NORM_LAYER),
                          (onednn, PRE_NORM_LAYER), (quantized, T5_GATED), (onednn, BART_LIKE)],
                         ids=["int8", "float32", "int8-layer-norm", "float32-layer-norm", "int8-gated",
                              "float32-gelu"])
def test_a_sentence_gets_the_same_bits_alone_as_in_any_batch_through_the_native_step(
        monkeypatch: pytest.MonkeyPatch, make: Callable[[Transformer], Transformer],
        options: dict[str, Any]) -> None:
    if make is onednn:
        require_float32_step()
    twin = make(tiny_model(vocab=40, seed=4, **options))
    monkeypatch.setattr(native_step, "_choices", _Always(True))
    src = sources(count=5, seed=1)
    max_len = torch.full((5,), 8)
    together = outputs(lambda: beam_search(twin, src, beam=3, alpha=0.6, max_len=max_len, nbest=2))
    for i in range(5):
        one = src[i:i + 1, : int((src[i] != 0).sum())]  # its own length, unpadded
        alone = outputs(lambda one=one: beam_search(twin, one, beam=3, alpha=0.6, max_len=max_len[:1],
                                                    nbest=2))
        assert alone == together[i:i + 1]


def test_the_native_step_fills_the_caches_as_the_layers_do(monkeypatch: pytest.MonkeyPatch) -> None:
    twin = quantized(tiny_model(vocab=40, seed=5, **T5_LIKE))
    src = sources(count=2)
    tokens = torch.tensor([[4, 9], [7, 7], [5, 30], [11, 12]])  # [N = 2 x 2, T]: two steps
    states, hidden = [], []
    for way in (True, False):
        monkeypatch.setattr(native_step, "_choices", _Always(way))
        state = twin.start(twin.encode(src), beam=2)
        hidden.append(torch.cat([twin.decode_hidden(tokens[:, t:t + 1], state=state) for t in range(2)], 1))
        states.append(state)
    assert torch.equal(hidden[0], hidden[1])
    for ours, theirs in zip(*(s.caches for s in states)):
        assert ours.length == theirs.length == 2
        assert torch.equal(ours.k, theirs.k) and torch.equal(ours.v, theirs.v)


def test_the_decoder_times_both_ways_then_keeps_the_faster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_step, "_choices", {})
    twin = quantized(tiny_model(vocab=40, seed=6, **T5_LIKE))
    src = sources(count=1)
    beam_search(twin, src, beam=4, alpha=0.6, max_len=torch.tensor([3 * native_step.TRIALS]), min_len=8)
    # per rows (the first step's one hypothesis, then the beam's four) and threads
    assert {rows for _, rows, _ in native_step._choices} <= {1, 4}
    # per decoder shape: another model's steps are timed for it
    other = quantized(tiny_model(vocab=40, seed=6, **{**T5_LIKE, "d_ff": 48}))
    beam_search(other, src, beam=4, alpha=0.6, max_len=torch.tensor([3 * native_step.TRIALS]), min_len=8)
    assert len({shape for shape, _, _ in native_step._choices}) == 2
    made = [c for c in native_step._choices.values() if c.chosen is not None]
    assert made and all(len(s) == native_step.TRIALS for c in made for s in c.seconds.values())


def test_models_the_step_does_not_cover_keep_the_layers() -> None:
    options = {**POST_NORM_RMS, "cross_attention": "milk"}  # another attention mechanism
    assert quantized(tiny_model(vocab=40, seed=0, **options)).native_step is None


@pytest.mark.parametrize("options,python_ffn", [(T5_LIKE, False), (T5_GATED, True), (BART_LIKE, True)],
                         ids=["relu", "gated-gelu", "gelu"])
def test_feed_forward_layers_no_kernel_computes_are_the_layers_own_between_sub_layers(
        options: dict[str, Any], python_ffn: bool) -> None:
    step = quantized(tiny_model(vocab=40, seed=0, **options)).native_step
    assert isinstance(step, native_step.NativeStep)
    assert step.python_ffn == python_ffn and (step.segmented or not python_ffn)


def test_int8_copies_normalise_with_the_native_layer_norm_and_float32_ones_keep_pytorchs() -> None:
    model = tiny_model(vocab=40, seed=0, **PRE_NORM_LAYER)
    twin = quantized(model)
    assert isinstance(twin.native_step, native_step.NativeStep)
    kinds = {type(m) for m in twin.modules()}
    assert NativeLayerNorm in kinds and torch.nn.LayerNorm not in kinds
    # the trained model keeps its own, and the copy shares its tensors
    assert not any(isinstance(m, NativeLayerNorm) for m in model.modules())
    assert twin.decoder_norm.weight is model.decoder_norm.weight
    if onednn_available():
        # F.layer_norm's bits, which no kernel gives: the step calls the layers' norms between
        # its native sub-layers
        float32 = onednn(model)
        assert not any(isinstance(m, NativeLayerNorm) for m in float32.modules())
        assert float32.native_step is not None and float32.native_step.segmented
        assert not twin.native_step.segmented


def test_the_step_is_off_with_its_variable_and_the_trained_model_itself_has_none(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = tiny_model(vocab=40, seed=0, **T5_LIKE)
    assert model.native_step is None
    monkeypatch.setenv("SEQTRANS_NATIVE_STEP", "0")
    assert quantized(model).native_step is None


def test_steps_the_native_step_does_not_cover_go_through_the_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    twin = quantized(tiny_model(vocab=40, seed=7, **T5_LIKE))
    monkeypatch.setattr(native_step, "_choices", _Always(True))
    monkeypatch.setattr(native, "decoder_step", lambda *a: pytest.fail("a native step for several positions"))
    state = twin.start(twin.encode(sources(count=1)), beam=1)
    twin.decode_hidden(torch.tensor([[4, 5, 6]]), state=state)  # three positions at once (a prefix)
    assert state.caches[0].length == 3


def test_a_copy_of_a_decoding_copy_steps_through_its_own_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    twin = quantized(tiny_model(vocab=40, seed=8, **T5_LIKE))
    other = copy.deepcopy(twin)
    assert isinstance(other.native_step, native_step.NativeStep) and other.native_step is not twin.native_step
    assert other.native_step.layers[0] is other.decoder[0]
    monkeypatch.setattr(native_step, "_choices", _Always(True))
    src, max_len = sources(count=3), torch.full((3,), 6)
    expected = outputs(lambda: beam_search(twin, src, beam=2, alpha=0.6, max_len=max_len))
    assert outputs(lambda: beam_search(other, src, beam=2, alpha=0.6, max_len=max_len)) == expected


def test_float32_steps_of_more_rows_than_its_layers_multiply_natively_go_through_the_layers(
        monkeypatch: pytest.MonkeyPatch) -> None:
    require_float32_step()
    twin = onednn(tiny_model(vocab=40, seed=9, **T5_LIKE))
    assert isinstance(twin.native_step, native_step.NativeStep)
    monkeypatch.setattr(native_step, "_choices", _Always(True))
    calls: list[int] = []
    real = native.decoder_step
    monkeypatch.setattr(native, "decoder_step", lambda *a: calls.append(a[2].size(0)) or real(*a))
    src = sources(count=3)
    beam_search(twin, src, beam=4, alpha=0.6, max_len=torch.full((3,), 4), min_len=4)  # 12 rows a step
    assert not calls
    beam_search(twin, src[:1], beam=4, alpha=0.6, max_len=torch.full((1,), 4), min_len=4)  # 4 rows
    assert calls and max(calls) <= 4


def test_threads_decoding_with_one_model_at_once_get_what_each_gets_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    twin = quantized(tiny_model(vocab=40, seed=10, **T5_LIKE))
    monkeypatch.setattr(native_step, "_choices", _Always(True))
    batches = [sources(count=3, seed=seed) for seed in range(4)]
    max_len = torch.full((3,), 10)

    def search(src: torch.Tensor) -> list[list[tuple[list[int], float]]]:
        with torch.no_grad():
            return outputs(lambda: beam_search(twin, src, beam=4, alpha=0.6, max_len=max_len, nbest=2))

    alone = [search(src) for src in batches]
    with ThreadPoolExecutor(max_workers=4) as pool:
        for _ in range(3):
            assert list(pool.map(search, batches)) == alone
