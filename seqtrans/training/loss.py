"""Label-smoothed cross-entropy (Szegedy et al. 2016; paper, section 5.4).

The target distribution puts 1 - eps on the reference token and spreads eps uniformly
over the whole vocabulary (as ``torch.nn.CrossEntropyLoss(label_smoothing=eps)``);
padding positions contribute nothing.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from seqtrans.vocab import PAD


def label_smoothed_loss(logits: Tensor, target: Tensor, *, smoothing: float,
                        ignore_index: int = PAD) -> tuple[Tensor, Tensor]:
    """Summed smoothed loss and summed negative log-likelihood over non-pad positions.

    logits [B, T, V], target [B, T] -> (loss [], nll [])
    loss = sum_t (1 - eps) * -log p(y_t) + eps / V * sum_v -log p(v)
    """
    log_probs = F.log_softmax(logits.float(), dim=-1)  # [B, T, V]
    keep = target.ne(ignore_index)  # [B, T]
    nll = -log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # [B, T]
    uniform = -log_probs.mean(dim=-1)  # [B, T]: eps/V * sum_v -log p(v), before eps
    loss = (1.0 - smoothing) * nll + smoothing * uniform
    return loss[keep].sum(), nll[keep].sum()
