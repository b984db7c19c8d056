"""Streaming a model whose encoder reads the whole source, by encoding the source read so
far again at each read: against a brute-force loop that runs the model offline for every
write, on tiny models trained briefly to copy; what holds once the whole source is read;
every streaming entry point (the session, predict --stream, evaluate --stream, the
SimulEval agent; the WebSocket in tests/serving/test_stream.py); and the refusal of a
learned policy without a causal encoder."""

from __future__ import annotations

import dataclasses
import random
from argparse import Namespace
from collections.abc import Sequence
from functools import cache
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from test_policies import Counting
from test_streaming import Arrivals, loaded_copy

import seqtrans
from conftest import tiny_model
from seqtrans.attention import reading
from seqtrans.config import DecodeConfig
from seqtrans.data.batches import pad_batch
from seqtrans.data.vocab import BOS, EOS, PAD
from seqtrans.decoding import greedy_search
from seqtrans.decoding.generate import max_output_length
from seqtrans.errors import UsageError
from seqtrans.inference.evaluation import Split
from seqtrans.inference.loading import Loaded
from seqtrans.model.transformer import Transformer
from seqtrans.streaming import predict as streaming_input
from seqtrans.streaming.decoder import Emission, StreamDecoder, check_streamable, stream_greedy
from seqtrans.streaming.evaluation import score_stream
from seqtrans.streaming.latency import corpus_latency, sentence_latency
from seqtrans.tasks import Example

SOURCES = [[4, 5, 6, 7, 8, 9, 10, 4, 5], [6], [10, 9, 8, 7, 6, 5, 4, 4, 5, 6, 7, 8], [5, 5, 5, 5],
           [7, 4, 9, 6, 10, 8]]


@cache
def copying_model(seed: int, wait_k: int = 0) -> Transformer:
    """A tiny model with a bidirectional encoder, 60 Adam updates into copying sequences of
    ids 4..10: its outputs follow the source and end by themselves. ``wait_k``: trained
    with that lag's mask."""
    model = tiny_model(seed=seed, wait_k=wait_k).train()
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest, and kind to a busy machine
    try:
        for _ in range(60):
            lengths = torch.randint(1, 10, (16,), generator=generator).tolist()
            sources = [torch.randint(4, 11, (n,), generator=generator).tolist() for n in lengths]
            logits = model(pad_batch(sources, after=EOS), pad_batch(sources, before=BOS))  # [B, T, V]
            loss = F.cross_entropy(logits.flatten(0, 1), pad_batch(sources, after=EOS).flatten(),
                                   ignore_index=PAD)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return model.eval()


@torch.no_grad()
def brute_force(model: Transformer, source: list[int], config: DecodeConfig, *,
                prefix: Sequence[int] = ()) -> tuple[list[Emission], int]:
    """The written tokens with their delays, and the end's delay: for each write t, the
    model run offline (no state kept) on the source prefix that write sees, min(t + k,
    |x| + 1) positions with the end symbol last, teacher-forced with the tokens written,
    its argmax taken; reading first where the bound a * (tokens read) + b would end it."""
    lag = config.wait_k or model.config.wait_k
    whole = [*source, EOS]
    tokens, written, positions = [BOS, *prefix], [], 0
    while True:
        t = len(tokens) - 1
        seen = min(t + lag, len(whole)) if lag else len(whole)
        positions = max(positions, seen)
        while positions < len(whole) and t >= max_output_length(min(positions, len(source)), config):
            positions += 1
        read = min(positions, len(source))
        with reading(config):
            logits = model.decode(torch.tensor([tokens]), model.encode(torch.tensor([whole[:seen]])))[0, -1]
        logits[[PAD, BOS]] = float("-inf")
        token = EOS if t >= max_output_length(read, config) else int(logits.argmax())
        if token == EOS:
            return written, read
        tokens.append(token)
        written.append(Emission(token, read))


def offline(model: Transformer, source: list[int], config: DecodeConfig, prefix: list[int]) -> list[int]:
    """Offline greedy decoding of the whole source with the decoding's lag, from ``prefix``."""
    limit = torch.tensor([max(max_output_length(len(source), config), len(prefix))])
    with reading(config):
        hyps = greedy_search(model, torch.tensor([[*source, EOS]]), max_len=limit,
                             prefixes=torch.tensor([prefix]) if prefix else None)
    return hyps[0][0].tokens if hyps[0] else []


@pytest.mark.parametrize("seed, trained_k, k, a, b", [
    (1, 0, 1, 1.0, 3), (1, 0, 3, 1.0, 3), (2, 2, 0, 1.0, 3), (1, 0, 2, 0.5, 1)])
def test_each_write_is_the_argmax_of_the_model_run_offline_on_the_prefix_it_sees(
        seed: int, trained_k: int, k: int, a: float, b: int) -> None:
    model = copying_model(seed, trained_k)
    config = DecodeConfig(beam=1, max_len_a=a, max_len_b=b, wait_k=k)
    outputs, early, ended = [], 0, 0
    for source in SOURCES:
        reference, end = brute_force(model, source, config)
        decoder = StreamDecoder(model, config)
        streamed = decoder.push(source) + decoder.finish()
        assert streamed == reference and decoder.end_delay == end
        outputs.append([e.token for e in streamed])
        early += sum(e.delay < len(source) for e in streamed)
        ended += len(streamed) < max_output_length(len(source), config)
    assert len({tuple(o) for o in outputs}) == len(SOURCES)  # the outputs follow the sources
    assert early > 0  # written before the source ended
    assert ended > 0 or a < 1  # ended by themselves, where the bound allows a copy


def test_the_schedule_is_wait_k_and_the_source_is_taken_only_as_far_as_it_is_read() -> None:
    model = copying_model(1)
    config = DecodeConfig(beam=1, max_len_b=20, wait_k=3)
    source = Counting(SOURCES[2])
    emitted = []
    for emission in stream_greedy(model, source, config):
        emitted.append(emission)
        assert source.taken == emission.delay  # read k + t, no further
    assert [e.delay for e in emitted] == [min(3 + t, len(SOURCES[2])) for t in range(len(emitted))]


def test_pushing_in_any_chunks_decodes_as_pulling_the_source() -> None:
    model = copying_model(1)
    config = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=3, wait_k=2)
    rng = random.Random(3)
    for source in SOURCES:
        pulled = list(stream_greedy(model, source, config))
        decoder = StreamDecoder(model, config)
        pushed, rest = [], list(source)
        while rest:
            n = rng.randint(0, 3)  # empty pushes too
            pushed += decoder.push(rest[:n])
            rest = rest[n:]
        assert pushed + decoder.finish() == pulled


@pytest.mark.parametrize("k", [0, 2, 13])
def test_once_the_whole_source_is_read_the_rest_is_offline_greedy_decoding_after_the_tokens_written(
        k: int) -> None:
    """A step that sees every position (t + k > |x|) has the states offline decoding has:
    the output from there on is offline greedy decoding's (with the same lag) continuing
    the tokens written. Without a lag, or a lag beyond the source, that is all of it. (An
    output whose end was decided on a prefix, as a model trained on whole sentences may
    do, never reaches that point.)"""
    model = copying_model(2)
    config = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=3, wait_k=k)
    reached = 0
    for source in SOURCES:
        streamed = [e.token for e in stream_greedy(model, source, config)]
        before_whole = max(0, len(source) + 1 - k) if k else 0  # tokens written before then
        if len(streamed) >= before_whole:
            reached += 1
            assert streamed == offline(model, source, config, streamed[:before_whole])
        if k == 0 or k > len(source):
            assert streamed == offline(model, source, config, [])
    assert reached >= 3


def test_a_forced_prefix_is_fed_and_not_written() -> None:
    model = copying_model(1)
    config = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=3, wait_k=2)
    for source in SOURCES:
        streamed = list(stream_greedy(model, source, config, prefix=[9]))
        assert streamed == brute_force(model, source, config, prefix=[9])[0]


def test_a_learned_policy_needs_a_causal_encoder_and_names_re_encoding() -> None:
    for policy in ("monotonic", "milk", "mma_hard", "mma_il"):
        with pytest.raises(UsageError, match=f"cross_attention={policy} .*causal_encoder=true.*scaled_dot"
                                             r".*wait-k \(decode.wait_k=K\), re-encoding"):
            check_streamable(tiny_model(cross_attention=policy))
    check_streamable(copying_model(1))  # scaled-dot, any encoder


# ------------------------------------------------------------------ the entry points


def _waiting(loaded: Loaded, k: int) -> Loaded:
    decode = dataclasses.replace(loaded.config.decode, wait_k=k)
    return dataclasses.replace(loaded, config=dataclasses.replace(loaded.config, decode=decode))


def _agent_words(loaded: Loaded, words: list[str], monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """The words SimulEval's agent writes for ``words`` sent one per call, each with the
    source words sent by then."""
    pytest.importorskip("simuleval")
    from simuleval.agents.actions import WriteAction

    from seqtrans.streaming import simuleval

    monkeypatch.setattr(simuleval, "load", lambda *args, **kwargs: loaded)
    agent = simuleval.Agent(Namespace(seqtrans_run="run", seqtrans_set=[], seqtrans_device="cpu"))
    states = SimpleNamespace(source=[], source_finished=False)
    written: list[tuple[str, int]] = []
    while True:
        action = agent.policy(states)
        if isinstance(action, WriteAction):
            written += [(word, len(states.source)) for word in action.content.split()]
            if action.finished:
                return written
        elif len(states.source) < len(words):
            states.source.append(words[len(states.source)])
        else:
            states.source_finished = True


def test_the_session_predict_evaluate_and_the_agent_stream_a_re_encoded_model(
        monkeypatch: pytest.MonkeyPatch) -> None:
    model = copying_model(1)
    loaded = _waiting(loaded_copy(model), 2)
    sources = SOURCES[:4]
    expected = [brute_force(model, s, loaded.config.decode) for s in sources]
    texts = [[str(t - 4) for t in s] for s in sources]  # the copy task's symbols 0..6 are ids 4..10
    for words, (reference, end) in zip(texts, expected):
        session = seqtrans.stream(loaded)
        for word in words:
            session.push(word)
        session.finish()
        assert [(t.id, t.delay) for t in session.tokens] == [(e.token, e.delay) for e in reference]
        assert session.end_delay == end
        # the copy task's words are its tokens: each is complete when the next is decided, or the end
        delays = [e.delay for e in reference]
        assert session.word_delays == [max(a, b) for a, b in zip(delays, delays[1:] + [end])]
        agent = _agent_words(loaded, words, monkeypatch)
        assert agent == list(zip(session.output.split(), session.word_delays))

    arrivals = Arrivals("".join(" ".join(words) + "\n" for words in texts))
    streaming_input.stream(loaded, arrivals, arrivals.write)
    assert "".join(text for _, text in arrivals.log).splitlines() == [
        " ".join(str(e.token - 4) for e in reference) + "\t" + " ".join(str(e.delay) for e in reference)
        for reference, _ in expected]

    examples = [Example([t - 4 for t in s], [t - 4 for t in s], origin=f"test:{i + 1}")
                for i, s in enumerate(sources)]
    outputs, metrics = score_stream(loaded, Split(examples))
    assert [(o.tokens, o.token_delays) for o in outputs] == [
        ([e.token for e in reference], [e.delay for e in reference]) for reference, _ in expected]
    latency = corpus_latency(sentence_latency(o.word_delays, source_length=len(s), reference_length=len(s))
                             for o, s in zip(outputs, sources))
    assert {name: metrics[f"stream_{name}"] for name in ("ap", "al", "dal")} == pytest.approx(
        {name: latency[name] for name in ("ap", "al", "dal")}, abs=1e-12)
