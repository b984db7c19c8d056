"""Label-smoothed cross-entropy (Szegedy et al. 2016; paper, section 5.4).

The target distribution puts 1 - eps on the reference token and spreads eps uniformly
over the whole vocabulary (as ``torch.nn.CrossEntropyLoss(label_smoothing=eps)``);
padding positions contribute nothing:

    loss = sum_t (1 - eps) * -log p(y_t) + eps * mean_v -log p(v)

:func:`label_smoothed_loss` takes logits. :func:`projected_label_smoothed_loss` takes
the decoder's last hidden states and the output projection instead, and computes the
logits a chunk of positions at a time together with their gradients, so the
``[tokens, V]`` logits are never held in memory (the same arithmetic as projecting and
then calling :func:`label_smoothed_loss`).

Shapes: B batch, T target length, M non-padding target positions, D model, V vocabulary.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seqtrans.data.vocab import PAD

#: Logit elements computed at once by the projected loss (64 MB in float32).
CHUNK_ELEMENTS = 1 << 24


def label_smoothed_loss(logits: Tensor, target: Tensor, *, smoothing: float,
                        ignore_index: int = PAD) -> tuple[Tensor, Tensor]:
    """Summed smoothed loss and summed negative log-likelihood over non-pad positions.

    logits [B, T, V], target [B, T] -> (loss [], nll [])
    """
    log_probs = F.log_softmax(logits.float(), dim=-1)  # [B, T, V]
    keep = target.ne(ignore_index)  # [B, T]
    nll = -log_probs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # [B, T]
    uniform = -log_probs.mean(dim=-1)  # [B, T]
    loss = (1.0 - smoothing) * nll + smoothing * uniform
    return loss[keep].sum(), nll[keep].sum()


class _ProjectedLoss(torch.autograd.Function):
    """Loss of ``hidden @ weight.T (+ bias)`` computed chunk by chunk; the gradients are
    formed in the forward pass, where each chunk's probabilities are at hand, and scaled
    in backward."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor,
                smoothing: float, chunk: int) -> tuple[Tensor, Tensor]:
        m, v = hidden.size(0), weight.size(0)
        ctx.weight_dtype = weight.dtype
        ctx.has_bias = bias is not None
        need_grad = any(ctx.needs_input_grad[:3])
        w = weight.to(hidden.dtype)
        grad_hidden = torch.empty_like(hidden) if need_grad else None
        grad_weight = (torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
                       if need_grad else None)
        grad_bias = (torch.zeros(v, dtype=torch.float32, device=weight.device)
                     if need_grad and bias is not None else None)
        loss = hidden.new_zeros((), dtype=torch.float32)
        nll_sum = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, m, chunk):
            h = hidden[start : start + chunk]  # [c, D]
            t = target[start : start + chunk]  # [c]
            logits = (h @ w.t()).float()  # [c, V]
            if bias is not None:
                logits += bias.float()
            lse = torch.logsumexp(logits, dim=-1)  # [c]
            nll = lse - logits.gather(1, t.unsqueeze(1)).squeeze(1)  # [c]
            uniform = lse - logits.mean(dim=-1)  # [c]: mean_v -log p(v)
            loss += ((1.0 - smoothing) * nll + smoothing * uniform).sum()
            nll_sum += nll.sum()
            if need_grad:
                # d loss / d logits = softmax - ((1 - eps) onehot + eps / V)
                grad = logits.sub_(lse.unsqueeze(1)).exp_().sub_(smoothing / v)  # [c, V]
                grad[torch.arange(t.numel(), device=t.device), t] -= 1.0 - smoothing
                grad = grad.to(hidden.dtype)
                grad_hidden[start : start + chunk] = grad @ w  # type: ignore[index]
                grad_weight.addmm_(grad.t().float(), h.float())  # type: ignore[union-attr]
                if grad_bias is not None:
                    grad_bias += grad.float().sum(0)
        ctx.mark_non_differentiable(nll_sum)
        if need_grad:
            ctx.save_for_backward(grad_hidden, grad_weight, *([grad_bias] if grad_bias is not None else []))
        return loss, nll_sum

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        grad_hidden, grad_weight, *more = ctx.saved_tensors
        scale = grad_loss.float()
        grad_bias = None
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = (more[0] * scale).to(ctx.weight_dtype)
        return ((grad_hidden.float() * scale).to(grad_hidden.dtype),
                (grad_weight * scale).to(ctx.weight_dtype) if ctx.needs_input_grad[1] else None,
                grad_bias, None, None, None)


def projected_label_smoothed_loss(hidden: Tensor, weight: Tensor, target: Tensor, *, smoothing: float,
                                  bias: Tensor | None = None,
                                  ignore_index: int = PAD) -> tuple[Tensor, Tensor]:
    """:func:`label_smoothed_loss` of ``hidden @ weight.T (+ bias)`` without materialising
    the logits.

    hidden [B, T, D], weight [V, D], bias [V] or None, target [B, T] -> (loss [], nll [])
    """
    keep = target.ne(ignore_index)  # [B, T]
    h = hidden[keep]  # [M, D]
    t = target[keep]  # [M]
    chunk = max(1, CHUNK_ELEMENTS // weight.size(0))
    loss, nll = _ProjectedLoss.apply(h, weight, bias, t, smoothing, chunk)
    return loss, nll


def expected_lagging(delays: Tensor, target_mask: Tensor, source_lengths: Tensor) -> Tensor:
    """Differentiable average lagging (Cherry and Foster 2019; the latency loss of MILk,
    Arivazhagan et al. 2019) of expected delays, per sentence:

        g'_1 = d_1,  g'_i = max(d_i, g'_{i-1} + 1/gamma),  DAL = 1/|y| sum_i (g'_i - (i-1)/gamma)

    with gamma = |y| / |x|. The max passes the gradient to whichever term is larger.
    delays [B, T] (source tokens read when each target token is written), target_mask
    [B, T] (True at real positions, a prefix of each row), source_lengths [B] -> [B]"""
    lengths = target_mask.sum(1).clamp(min=1).to(delays.dtype)  # [B]
    step = source_lengths.clamp(min=1).to(delays.dtype) / lengths  # 1 / gamma
    lagged = delays[:, 0]
    total = lagged.clone()
    for i in range(1, delays.size(1)):
        lagged = torch.maximum(delays[:, i], lagged + step)
        total = total + (lagged - i * step) * target_mask[:, i]
    return total / lengths


def latency_losses(delays: list[Tensor], target_mask: Tensor,
                   source_lengths: Tensor) -> tuple[Tensor, Tensor]:
    """The two latency losses of monotonic multihead attention (Ma et al. 2020), per sentence,
    from each decoder layer's expected delays, one row per monotonic head:

    - average: per layer, the heads' delays of each step combined by a softmax-weighted
      average (a soft maximum: the step waits for its slowest head, and every head gets a
      gradient; fairseq's default ``--average-method weighted_average``), their
      differentiable average lagging (:func:`expected_lagging`), averaged over the layers;
      with one head per layer (MILk), MILk's latency loss;
    - variance: the variance over every head of every layer of the delays of each target
      position (population variance: 0 for a single head), averaged over the real positions.

    delays: per layer [B, T] (one head) or [B, H, T]; target_mask [B, T]; source_lengths
    [B] -> (average [B], variance [B])"""
    heads = [d.unsqueeze(1) if d.dim() == 2 else d for d in delays]  # [B, H, T] each
    b, _, t = heads[0].shape
    keep = target_mask.to(heads[0].dtype)  # [B, T]
    average = []
    for d in heads:
        slowest = (d.softmax(dim=1) * d).sum(dim=1)  # [B, T]
        average.append(expected_lagging(slowest, target_mask, source_lengths))
    every = torch.cat(heads, dim=1)  # [B, L*H, T]
    variance = every.var(dim=1, unbiased=False)  # [B, T]
    return (torch.stack(average).mean(0),
            (variance * keep).sum(1) / keep.sum(1).clamp(min=1))
