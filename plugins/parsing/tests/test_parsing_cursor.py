"""The source cursor and the span cursor (the parsing task's model extensions) against
loops over their definitions, and through the engine's model as its extensions."""

from __future__ import annotations

import pytest
import torch

from seqtrans import Transformer
from seqtrans.inference.export import export_ctranslate2  # internal: what export refuses of a cursor
from seqtrans.plugin import BOS, EOS, PAD, ExtensionError, ModelConfig, Vocab, Vocabularies
from seqtrans.streaming.decoder import check_streamable  # internal: what streaming refuses of a cursor
from seqtrans_parsing.cursor import SourceCursor, SpanCursor
from seqtrans_parsing.walk import SourceWalk

# the walk of the test models: token 4 of the target consumes a unit, a unit starts at
# source tokens 4 and 6; target token 5 opens a span, 6 closes one
TEST_WALK = SourceWalk(advance=(4,), starts=(4, 6), opens=(5,), closes=(6,))


def tiny_model(*, source_cursor: bool = False, span_cursor: bool = False, seed: int = 0,
               **overrides: object) -> Transformer:
    """A 2-layer, width-16 model in eval mode with the cursors asked for, walking TEST_WALK."""
    torch.manual_seed(seed)
    config = ModelConfig(**{"encoder_layers": 2, "decoder_layers": 2, "d_model": 16, "d_ff": 32, "heads": 4,
                            "dropout": 0.0, **overrides})  # type: ignore[arg-type]
    model = Transformer(config, source_vocab_size=11, target_vocab_size=11, shared_vocab=True)
    extensions = {}
    if source_cursor:
        extensions["source_cursor"] = SourceCursor(config.d_model, TEST_WALK)
    if span_cursor:
        extensions["span_cursor"] = SpanCursor(config.d_model, TEST_WALK)
    model.extend(extensions)
    return model.eval()


def cursor_of(model: Transformer) -> SourceCursor:
    cursor = model.extensions["source_cursor"]
    assert isinstance(cursor, SourceCursor)
    return cursor


def span_cursor_of(model: Transformer) -> SpanCursor:
    cursor = model.extensions["span_cursor"]
    assert isinstance(cursor, SpanCursor)
    return cursor


def test_source_cursor_adds_the_state_of_the_first_unit_not_yet_consumed() -> None:
    """Against a loop over the definition: a unit starts at each source token of
    TEST_WALK.starts (4 and 6); each target 4 consumes one; input t sees the projected
    encoder state of unit (4s among inputs 0..t), or zero past the last unit."""
    model = tiny_model(source_cursor=True)
    src = torch.tensor([[6, 5, 4, 4, 7, EOS], [9, 4, EOS, PAD, PAD, PAD], [5, 5, EOS, PAD, PAD, PAD]])
    tgt = torch.tensor([[BOS, 4, 5, 4, 4, 4, 7], [BOS, 5, 4, 4, 7, 8, 9], [BOS, 4, 5, 6, 7, 8, 9]])
    with torch.no_grad():
        encoded = model.encode(src)
        cursor = cursor_of(model)
        seen, consumed = cursor.inputs(tgt, encoded.context["source_cursor"])
        for b in range(src.size(0)):
            starts = [s for s in range(src.size(1)) if int(src[b, s]) in TEST_WALK.starts]
            for t in range(tgt.size(1)):
                k = sum(int(y) in TEST_WALK.advance for y in tgt[b, : t + 1])
                expected = (cursor.proj(encoded.memory[b, starts[k]]) if k < len(starts)
                            else torch.zeros(model.config.d_model))
                torch.testing.assert_close(seen[b, t], expected)
        assert consumed.tolist() == [4, 2, 1]
        # the same weights without the cursor's contribution compute something else
        with_cursor = model(src, tgt)
        cursor.proj.weight.zero_()
        without = model(src, tgt)
        assert not torch.allclose(with_cursor, without)
        torch.testing.assert_close(without, tiny_model()(src, tgt))


# ------------------------------------------------------------------ the span cursor

OPEN, CLOSE, STEP = 5, 6, 4  # TEST_WALK's opening, closing and advancing target ids


def stack_loop(tokens: list[int]) -> list[int]:
    """The definition, one token at a time: after each token, the unit where the innermost
    open span starts (the units consumed when it opened), -1 when none is open."""
    consumed, stack, out = 0, [], []
    for y in tokens:
        if y == OPEN:
            stack.append(consumed)
        elif y == CLOSE and stack:
            stack.pop()
        consumed += y == STEP
        out.append(stack[-1] if stack else -1)
    return out


@pytest.mark.parametrize("tokens, expected", [
    # a span at 0 holds one at 1; both close; a close with nothing open; a span at 3
    ([BOS, 5, 4, 5, 4, 6, 4, 6, 6, 5], [-1, 0, 0, 1, 1, 0, 0, -1, -1, 3]),
    # closes with nothing open change nothing: the next span is one level deep again
    ([5, 4, 6, 6, 6, 5, 4, 5, 6, 4], [0, 0, -1, -1, -1, 1, 1, 2, 1, 1]),
    # nested spans, one opened at a later unit, left open at the end
    ([6, 5, 4, 5, 4, 4, 5, 6, 6, 4, 6, 6, 5, 7], [-1, 0, 0, 1, 1, 1, 3, 1, 0, 0, -1, -1, 4, 4]),
])
def test_span_starts_by_hand(tokens: list[int], expected: list[int]) -> None:
    model = tiny_model(span_cursor=True)
    assert span_cursor_of(model).span_starts(torch.tensor([tokens])).tolist() == [expected]
    assert stack_loop(tokens) == expected


def test_span_starts_equal_a_stack_loop_on_random_sequences() -> None:
    cursor = span_cursor_of(tiny_model(span_cursor=True))
    g = torch.Generator().manual_seed(0)
    for length in (1, 7, 40):
        # mostly brackets, so that spans nest deep and closes often find nothing open
        tokens = torch.tensor([3, 4, 5, 5, 6, 6, 7])[torch.randint(0, 7, (64, length), generator=g)]
        expected = [stack_loop(row) for row in tokens.tolist()]
        assert cursor.span_starts(tokens).tolist() == expected


def test_span_cursor_adds_the_state_of_the_innermost_open_spans_first_unit() -> None:
    """Against the stack loop: input t sees the projected encoder state of unit
    stack_loop(inputs 0..t)[t], zero when no span is open or it starts past the last unit."""
    model = tiny_model(span_cursor=True)
    src = torch.tensor([[6, 5, 4, 4, 7, EOS], [9, 4, EOS, PAD, PAD, PAD], [5, 5, EOS, PAD, PAD, PAD]])
    # the second row consumes its only unit, then opens a span past it
    tgt = torch.tensor([[BOS, 5, 4, 5, 4, 6, 4], [BOS, 5, 4, 6, 5, 4, 9], [BOS, 6, 5, 5, 4, 6, 6]])
    with torch.no_grad():
        encoded = model.encode(src)
        assert list(encoded.context) == ["span_cursor"]
        cursor = span_cursor_of(model)
        seen = cursor.inputs(tgt, encoded.context["span_cursor"])
        zero = torch.zeros(model.config.d_model)
        for b in range(src.size(0)):
            starts = [s for s in range(src.size(1)) if int(src[b, s]) in TEST_WALK.starts]
            for t, k in enumerate(stack_loop(tgt[b].tolist())):
                inside = 0 <= k < len(starts)
                expected = cursor.proj(encoded.memory[b, starts[k]]) if inside else zero
                torch.testing.assert_close(seen[b, t], expected)
        assert seen[1, 4].abs().sum() == 0 and seen[1, 1].abs().sum() > 0  # past the last unit
        # the same weights without the span cursor's contribution compute something else
        with_span = model(src, tgt)
        cursor.proj.weight.zero_()
        without = model(src, tgt)
        assert not torch.allclose(with_span, without)
        torch.testing.assert_close(without, tiny_model()(src, tgt))


def test_incremental_span_inputs_equal_teacher_forced_ones_through_beam_reorders() -> None:
    """Step by step, from a stack with little room (it grows), hypotheses reordered as a
    search does: each step adds what the teacher-forced inputs of its history add."""
    model = tiny_model(span_cursor=True)
    cursor = span_cursor_of(model)
    src = torch.tensor([[4, 5, 6, 4, 6, 4, 4, EOS], [6, 4, 6, EOS, PAD, PAD, PAD, PAD]])
    g = torch.Generator().manual_seed(3)
    k = 3
    with torch.no_grad():
        units = model.encode(src).context["span_cursor"]
        state = cursor.start(units, 2 * k, room=2)
        history = torch.full((2 * k, 1), BOS)
        first = cursor.inputs(history, units.repeat_interleave(k, 0))
        torch.testing.assert_close(cursor.step(history, state), first)
        for step in range(30):
            chunk = 1 + step % 3  # several tokens at once, as prefix forcing does
            tokens = torch.tensor([4, 5, 5, 6, 7])[torch.randint(0, 5, (2 * k, chunk), generator=g)]
            added = cursor.step(tokens, state)
            history = torch.cat([history, tokens], 1)
            whole = cursor.inputs(history, units.repeat_interleave(k, 0))  # [N, T, D]
            torch.testing.assert_close(added, whole[:, -chunk:])
            # the search keeps some hypotheses of each sentence, some twice
            rows = (torch.arange(2).repeat_interleave(k) * k
                    + torch.randint(0, k, (2 * k,), generator=g))
            state.reorder(rows)
            history = history[rows]
        assert state.stack.size(1) > 2
        # a sentence finishes: the rest keep their stacks
        state.reorder(torch.arange(k, 2 * k), torch.tensor([1]))
        tokens = torch.full((k, 1), 6)
        whole = cursor.inputs(torch.cat([history[k:], tokens], 1), units[1:].repeat_interleave(k, 0))
        torch.testing.assert_close(cursor.step(tokens, state), whole[:, -1:])


def test_span_cursor_needs_a_walk_that_declares_spans() -> None:
    with pytest.raises(ValueError, match="declares spans"):
        SpanCursor(16, SourceWalk(advance=(4,), starts=(4,)))
    with pytest.raises(ValueError, match="advance and opens share target ids \\[4\\]"):
        SourceWalk(advance=(4,), starts=(4,), opens=(4, 5), closes=(6,))
    with pytest.raises(ValueError, match="opens and closes share"):
        SourceWalk(advance=(4,), starts=(4,), opens=(5,), closes=(5, 6))
    with pytest.raises(ValueError, match="both opening and closing"):
        SourceWalk(advance=(4,), starts=(4,), opens=(5,))
    # a model without the span cursor stores nothing of it
    assert not any("span" in key for key in tiny_model(source_cursor=True).state_dict())
    both = tiny_model(source_cursor=True, span_cursor=True).state_dict()
    assert sorted(k for k in both if "cursor" in k) == [
        "extensions.source_cursor.proj.weight", "extensions.span_cursor.proj.weight"]


@pytest.mark.parametrize("name", ["source_cursor", "span_cursor"])
def test_export_and_streaming_refuse_the_cursors_with_their_reason(name: str, tmp_path) -> None:
    model = tiny_model(**{name: True}, cross_attention="monotonic", causal_encoder=True)
    with pytest.raises(ExtensionError, match=f"streaming .* extension '{name}' .* finds the source's words"):
        check_streamable(model)
    plain = tiny_model(**{name: True})
    vocab = Vocab([str(i) for i in range(7)])
    with pytest.raises(ExtensionError, match=f"exporting it .* '{name}' .* CTranslate2's decoder"):
        export_ctranslate2(plain, Vocabularies(vocab, vocab), tmp_path / "out")
