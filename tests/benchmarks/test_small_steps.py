"""The shapes part of ``python -m benchmarks small_steps`` times each product it names,
float32 through oneDNN included, so the benchmark cannot rot between its runs."""

from __future__ import annotations

import pytest
import torch

from benchmarks import small_steps
from seqtrans import native
from seqtrans.linear.onednn import onednn_available


@pytest.mark.skipif(not native.int8_product_available() or not onednn_available(),
                    reason="needs the native int8 product and oneDNN's linear operator")
def test_the_shapes_part_times_every_product_per_call() -> None:
    with torch.inference_mode():
        rows = small_steps._shape_rows([1, 3, 17], 16, 24, 1, 0.0)
    assert [r["rows"] for r in rows] == [1, 3, 17]
    for row in rows:
        for way in ("native", "torch", "fp32", "onednn", "onednn_op"):
            assert row[f"{way}_us"] > 0
            assert row[f"{way}_gops"] == pytest.approx(2 * row["rows"] * 16 * 24 / row[f"{way}_us"] / 1e3)
