"""The source cursor against a loop over its definition."""

from __future__ import annotations

import pytest
import torch

from conftest import TEST_WALK, tiny_model
from seqtrans.config import ModelConfig
from seqtrans.errors import ConfigError
from seqtrans.model import Transformer
from seqtrans.vocab import BOS, EOS, PAD


def test_source_cursor_adds_the_state_of_the_first_unit_not_yet_consumed() -> None:
    """Against a loop over the definition: a unit starts at each source token of
    TEST_WALK.starts (4 and 6); each target 4 consumes one; input t sees the projected
    encoder state of unit (4s among inputs 0..t), or zero past the last unit."""
    model = tiny_model(source_cursor=True)
    src = torch.tensor([[6, 5, 4, 4, 7, EOS], [9, 4, EOS, PAD, PAD, PAD], [5, 5, EOS, PAD, PAD, PAD]])
    tgt = torch.tensor([[BOS, 4, 5, 4, 4, 4, 7], [BOS, 5, 4, 4, 7, 8, 9], [BOS, 4, 5, 6, 7, 8, 9]])
    with torch.no_grad():
        encoded = model.encode(src)
        assert encoded.units is not None
        assert model.cursor is not None
        seen, consumed = model.cursor.inputs(tgt, encoded.units)
        for b in range(src.size(0)):
            starts = [s for s in range(src.size(1)) if int(src[b, s]) in TEST_WALK.starts]
            for t in range(tgt.size(1)):
                k = sum(int(y) in TEST_WALK.advance for y in tgt[b, : t + 1])
                expected = (model.cursor.proj(encoded.memory[b, starts[k]]) if k < len(starts)
                            else torch.zeros(model.config.d_model))
                torch.testing.assert_close(seen[b, t], expected)
        assert consumed.tolist() == [4, 2, 1]
        # the same weights without the cursor's contribution compute something else
        with_cursor = model(src, tgt)
        model.cursor.proj.weight.zero_()
        without = model(src, tgt)
        assert not torch.allclose(with_cursor, without)
        torch.testing.assert_close(without, tiny_model()(src, tgt))


def test_source_cursor_needs_a_codec_that_declares_a_walk() -> None:
    with pytest.raises(ConfigError, match="source_cursor"):
        Transformer(ModelConfig(source_cursor=True), source_vocab_size=9, target_vocab_size=9,
                    shared_vocab=True)
