"""Small decoding steps compute with one thread or all, whichever was timed faster
(seqtrans.decoding.teams): both are tried, one is kept, and the team never changes a
result."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from seqtrans.config import DecodeConfig, ModelConfig
from seqtrans.data.vocab import EOS
from seqtrans.decoding import beam_search, greedy_search, teams
from seqtrans.decoding.generate import generate
from seqtrans.model.transformer import Transformer

VOCAB = 50


@pytest.fixture
def fresh_teams(monkeypatch: Any) -> Iterator[teams.StepTeams]:
    """Fresh choices, two threads, and the process's count put back afterwards."""
    chosen = teams.StepTeams()
    monkeypatch.setattr(teams, "TEAMS", chosen)
    monkeypatch.delenv("SEQTRANS_STEP_TEAMS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield chosen
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model() -> Transformer:
    torch.manual_seed(0)
    config = ModelConfig(encoder_layers=2, decoder_layers=2, d_model=32, d_ff=64, heads=4, dropout=0.0)
    return Transformer(config, source_vocab_size=VOCAB, target_vocab_size=VOCAB, shared_vocab=True).eval()


def _sources(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, VOCAB, (int(length),), generator=g).tolist() + [EOS]
            for length in torch.randint(3, 12, (n,), generator=g)]


def _teams_seen(model: Transformer, monkeypatch: Any) -> list[int]:
    """The thread count of each decoder step of ``model`` from now on (a beam's first step
    scores its rows with ``decode_rows``)."""
    seen: list[int] = []
    for name in ("decode", "decode_rows"):
        step = getattr(model, name)

        def counted(*args: Any, step: Any = step, **kwargs: Any) -> Any:
            seen.append(torch.get_num_threads())
            return step(*args, **kwargs)

        monkeypatch.setattr(model, name, counted)
    return seen


def test_small_steps_try_both_teams_then_keep_one(model: Transformer, fresh_teams: teams.StepTeams,
                                                  monkeypatch: Any) -> None:
    seen = _teams_seen(model, monkeypatch)
    src = torch.tensor([[5, 6, 7, 8, EOS]])
    with torch.no_grad():
        beam_search(model, src, beam=3, alpha=0.6, max_len=torch.tensor([30]), min_len=30)
    trials = seen[: 2 * teams.TRIALS]
    assert sorted(trials) == [1] * teams.TRIALS + [2] * teams.TRIALS  # in turn
    kept = fresh_teams.choices(model)
    assert list(kept) == [(3, 2)] and kept[(3, 2)] in (1, 2)
    assert set(seen[2 * teams.TRIALS:]) == {kept[(3, 2)]}
    assert torch.get_num_threads() == 2  # put back after every step


def test_a_choice_is_timed_again_once_it_is_old(model: Transformer, fresh_teams: teams.StepTeams,
                                                monkeypatch: Any) -> None:
    monkeypatch.setattr(teams, "RETRY_S", 0.0)
    seen = _teams_seen(model, monkeypatch)
    with torch.no_grad():
        greedy_search(model, torch.tensor([[5, 6, EOS]]), max_len=torch.tensor([40]), min_len=40)
    trials = 2 * teams.TRIALS
    assert sorted(seen[trials : 2 * trials]) == [1] * teams.TRIALS + [2] * teams.TRIALS  # a second trial


def test_large_nested_or_unwanted_steps_keep_every_thread(model: Transformer, fresh_teams: teams.StepTeams,
                                                          monkeypatch: Any) -> None:
    seen = _teams_seen(model, monkeypatch)
    rows = teams.SMALL_STEP_ROWS + 1
    src = torch.tensor([[5, 6, 7, EOS]] * rows)
    with torch.no_grad():
        greedy_search(model, src, max_len=torch.full((rows,), 12), min_len=12)
        assert set(seen) == {2} and fresh_teams.choices(model) == {}
        seen.clear()
        with fresh_teams.step(object(), 1, torch.device("cpu")):  # another thread's, as a server's worker
            greedy_search(model, src[:1], max_len=torch.tensor([12]), min_len=12)
        assert set(seen) == {2}
        seen.clear()
        monkeypatch.setenv("SEQTRANS_STEP_TEAMS", "0")
        greedy_search(model, src[:1], max_len=torch.tensor([12]), min_len=12)
        assert set(seen) == {2} and fresh_teams.choices(model) == {}


def test_steps_on_another_device_keep_every_thread(model: Transformer, fresh_teams: teams.StepTeams) -> None:
    for _ in range(3 * teams.TRIALS):
        with fresh_teams.step(model, 1, torch.device("meta")):  # as a GPU's: nothing chosen
            assert torch.get_num_threads() == 2
    assert fresh_teams.choices(model) == {}
    for _ in range(2 * teams.TRIALS):  # the same steps on the CPU: both teams tried, one kept
        with fresh_teams.step(model, 1, torch.device("cpu")):
            pass
    assert list(fresh_teams.choices(model)) == [(1, 2)]


@pytest.mark.usefixtures("native_kernels")
@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("beam", [1, 4])
def test_a_decode_has_the_same_bits_whatever_its_team(model: Transformer, fresh_teams: teams.StepTeams,
                                                      monkeypatch: Any, precision: str, beam: int) -> None:
    sources = _sources(6)
    config = DecodeConfig(beam=beam, precision=precision, batch_tokens=10**6, max_len_a=1.0, max_len_b=8)

    def decoded() -> list[tuple[list[int], float]]:
        with torch.no_grad():  # a sentence at a time: steps small enough to choose a team for
            return [(h[0].tokens, h[0].log_prob) for s in sources
                    for h in generate(model, [s], config, device=torch.device("cpu"))]

    # Only the steps change team: the encoder runs with the process's count either way
    # (PyTorch's CPU attention kernel sums in an order that follows the thread count on
    # some processors, AVX2 ones among them, so the process's count may change bits).
    monkeypatch.setenv("SEQTRANS_STEP_TEAMS", "0")
    one = decoded()  # every step with the process's two threads

    @contextlib.contextmanager
    def one_thread(model: object, rows: int, device: torch.device) -> Iterator[None]:
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(2)

    with monkeypatch.context() as forced:  # every step with a team of one
        forced.setattr(teams, "step", one_thread)
        assert decoded() == one
    monkeypatch.delenv("SEQTRANS_STEP_TEAMS")
    for _ in range(3):  # through the trials and past them
        assert decoded() == one
