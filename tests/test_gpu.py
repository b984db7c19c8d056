"""The same results on CUDA as on the CPU (skipped without a CUDA device)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import tiny_model
from seqtrans import pipeline
from seqtrans.decoding import beam_search, greedy_search
from seqtrans.vocab import BOS, EOS, PAD

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
    config = pipeline.resolve_config("copy", overrides=[
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
        from seqtrans.decoding.streaming import stream_greedy

        streamed = [e.token for e in stream_greedy(model, [5, 6, 7], DecodeConfig(beam=1))]
        offline = greedy_search(model, src[:1].to(CUDA), max_len=torch.tensor([53]))
        assert streamed == offline[0][0].tokens
