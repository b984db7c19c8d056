"""The autocast context of the precision settings (``train.precision``, ``decode.precision``)."""

from __future__ import annotations

import torch


def autocast(device: torch.device, precision: str) -> torch.autocast:
    """The autocast context of a ``train.precision`` / ``decode.precision`` setting:
    bfloat16 for ``"bf16"``, float16 for ``"fp16"``, disabled for ``"fp32"``."""
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return torch.autocast(device.type, dtype=dtype, enabled=precision in ("bf16", "fp16"))
