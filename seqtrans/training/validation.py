"""The loss on the dev set during training: label-smoothed loss and perplexity per
target token, its batches dealt to the ranks in turn and their sums added up."""

from __future__ import annotations

import math

import torch

from seqtrans.data.batches import Pairs, lengths_of, token_batches
from seqtrans.training import distributed
from seqtrans.training.distributed import World
from seqtrans.training.step import LossModule

#: Perplexity is reported as exp(min(NLL, this)), so an untrained model gives a number.
MAX_LOG_PPL = 50.0


@torch.inference_mode()
def dev_loss(loss_module: LossModule, dev: Pairs, *, max_tokens: int, world: World,
             device: torch.device) -> dict[str, float]:
    """``{"dev_loss": ..., "dev_ppl": ...}`` of ``dev`` under the model of ``loss_module``."""
    loss_module.model.eval()
    loss_sum = nll_sum = 0.0
    tokens = 0
    batches = token_batches(lengths_of(dev.src), lengths_of(dev.tgt), max_tokens, seed=0, epoch=0,
                            shuffle=False)
    for idx in batches[world.rank:: world.size]:
        batch = dev.batch(idx).to(device)
        loss, nll = loss_module(batch.src, batch.tgt_in, batch.tgt_out)
        loss_sum += float(loss)
        nll_sum += float(nll)
        tokens += batch.target_tokens
    loss_sum, nll_sum, total = distributed.all_sum([loss_sum, nll_sum, tokens])
    return {"dev_loss": loss_sum / total, "dev_ppl": math.exp(min(nll_sum / total, MAX_LOG_PPL))}
