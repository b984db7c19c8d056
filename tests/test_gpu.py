"""The same results on CUDA as on the CPU (skipped without a CUDA device)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from distributed_worker import MODEL, copy_pairs

import seqtrans
from conftest import tiny_model
from seqtrans import pipeline
from seqtrans.config import RunConfig, TrainConfig
from seqtrans.data.vocab import BOS, EOS, PAD
from seqtrans.decoding import beam_search, greedy_search
from seqtrans.errors import TrainingError
from seqtrans.model.transformer import Transformer
from seqtrans.training.loop import Trainer

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")


def test_forward_matches_the_cpu() -> None:
    model = tiny_model()
    src = torch.tensor([[5, 6, 7, EOS], [8, EOS, PAD, PAD]])
    tgt = torch.tensor([[BOS, 4, 5], [BOS, 9, 10]])
    with torch.no_grad():
        cpu = model(src, tgt)
        gpu = model.to(CUDA)(src.to(CUDA), tgt.to(CUDA)).cpu()
    torch.testing.assert_close(gpu, cpu, atol=1e-4, rtol=1e-4)


def test_search_matches_the_cpu() -> None:
    model = tiny_model(seed=2)
    src = torch.tensor([[5, 6, 7, EOS], [8, EOS, PAD, PAD]])
    max_len = torch.tensor([6, 6])
    cpu = beam_search(model, src, beam=4, alpha=0.6, max_len=max_len, nbest=2)
    cpu_greedy = greedy_search(model, src, max_len=max_len)
    model.to(CUDA)
    gpu = beam_search(model, src.to(CUDA), beam=4, alpha=0.6, max_len=max_len, nbest=2)
    gpu_greedy = greedy_search(model, src.to(CUDA), max_len=max_len)
    assert [[h.tokens for h in hs] for hs in gpu] == [[h.tokens for h in hs] for hs in cpu]
    assert [[h.tokens for h in hs] for hs in gpu_greedy] == [[h.tokens for h in hs] for hs in cpu_greedy]


def test_copy_runs_end_to_end_on_cuda(tmp_path: Path) -> None:
    config = seqtrans.resolve_config("copy", overrides=[
        "data.max_length=10", "train.max_steps=1200", "train.max_minutes=0", "data.test_size=500"])
    metrics = pipeline.run(config, tmp_path, device="cuda")
    assert metrics["exact_match"] >= 0.95


@pytest.mark.parametrize("options", [
    {"encoder_attention": "restricted", "decoder_attention": "additive", "cross_attention": "local"},
    {"encoder_attention": "general", "decoder_attention": "location", "cross_attention": "memory",
     "location_max_length": 16, "memory_positions": True},
    {"cross_attention": "monotonic", "causal_encoder": True, "monotonic_noise": 0.0, "monotonic_r_init": 0.0},
])
def test_attention_mechanisms_match_the_cpu(options: dict) -> None:
    model = tiny_model(seed=3, **options)
    src = torch.tensor([[5, 6, 7, EOS], [8, EOS, PAD, PAD]])
    tgt = torch.tensor([[BOS, 4, 5], [BOS, 9, 10]])
    max_len = torch.tensor([6, 6])
    with torch.no_grad():
        cpu = [model.train()(src, tgt), model.eval()(src, tgt)]
    cpu_beam = beam_search(model, src, beam=3, alpha=0.6, max_len=max_len)
    model.to(CUDA)
    with torch.no_grad():
        gpu = [model.train()(src.to(CUDA), tgt.to(CUDA)).cpu(),
               model.eval()(src.to(CUDA), tgt.to(CUDA)).cpu()]
    for a, b in zip(gpu, cpu):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    gpu_beam = beam_search(model, src.to(CUDA), beam=3, alpha=0.6, max_len=max_len)
    assert [[h.tokens for h in hs] for hs in gpu_beam] == [[h.tokens for h in hs] for hs in cpu_beam]
    if options["cross_attention"] == "monotonic":
        from seqtrans.config import DecodeConfig
        from seqtrans.streaming.decoder import stream_greedy

        streamed = [e.token for e in stream_greedy(model, [5, 6, 7], DecodeConfig(beam=1))]
        offline = greedy_search(model, src[:1].to(CUDA), max_len=torch.tensor([53]))
        assert streamed == offline[0][0].tokens


def gpu_trainer(tmp_path: Path, **train: object) -> Trainer:
    options = {"max_tokens": 64, "warmup": 10, "checkpoint_every": 1000, "eval_every": 1000,
               "log_every": 1000, "keep_checkpoints": 1, "average_last": 1, **train}
    config = RunConfig(task="test", model=MODEL, train=TrainConfig(**options), seed=3)  # type: ignore[arg-type]
    torch.manual_seed(0)
    model = Transformer(MODEL, source_vocab_size=12, target_vocab_size=12, shared_vocab=True)
    return Trainer(model, config, copy_pairs(40), directory=tmp_path, device=CUDA)


def test_precision_auto_is_bf16_on_a_gpu_with_bf16(tmp_path: Path) -> None:
    expected = "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    assert gpu_trainer(tmp_path, precision="auto").precision == expected


def test_fp16_skips_overflowing_updates_and_stops_when_the_scale_collapses(tmp_path: Path) -> None:
    t = gpu_trainer(tmp_path / "a", precision="fp16", max_steps=3)
    t.fit()
    assert t.state.step == 3 and t.scaler.get_scale() > 1  # fp16 trains
    t = gpu_trainer(tmp_path / "b", precision="fp16", max_steps=3)
    # a scale that makes the fp16 gradients overflow, set as a resumed checkpoint sets it
    # (``update(new_scale)`` needs a ``scale()`` call first)
    t.scaler.load_state_dict({**t.scaler.state_dict(), "scale": 1e30})
    t.fit()
    assert t.state.skipped_updates >= 1 and t.state.step == 3  # skipped, not counted
    t = gpu_trainer(tmp_path / "c", precision="fp16", max_steps=3)
    with torch.no_grad():
        next(t.model.parameters()).fill_(float("nan"))  # every update overflows
    with pytest.raises(TrainingError, match="loss scale fell"):
        t.fit()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_gpus_make_the_updates_of_one_process_accumulating_two(tmp_path: Path) -> None:
    from test_distributed import STEPS, assert_weights_close, final_weights, train, updates

    train(tmp_path / "one", 1, STEPS, 2, device="cuda")
    train(tmp_path / "two", 2, STEPS, 1, device="cuda")
    assert updates(tmp_path / "two") == updates(tmp_path / "one")
    assert_weights_close(final_weights(tmp_path / "two"), final_weights(tmp_path / "one"))
