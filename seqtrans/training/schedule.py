"""The learning-rate schedule of section 5.3: linear warm-up, then inverse square root;
optionally a linear cool-down to zero at the end of a fixed budget."""

from __future__ import annotations

from dataclasses import dataclass


def inverse_sqrt_lr(step: int, *, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), steps counted from 1."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def cooldown_factor(used: float, cooldown: float) -> float:
    """The factor on the rate when the fraction ``used`` of a training budget is spent: 1
    until the last ``cooldown`` fraction of the budget, then falling linearly to 0 at its
    end (the short-budget annealing of Li et al. 2020, "Budgeted Training"); 1 throughout
    when ``cooldown`` is 0."""
    if cooldown <= 0.0:
        return 1.0
    return min(1.0, max(0.0, (1.0 - used) / cooldown))


@dataclass(frozen=True)
class Schedule:
    """The rate of each update of a run: :func:`inverse_sqrt_lr`, and with a ``cooldown``
    scaled down over the end of the budget: updates (``max_steps``) or time
    (``max_minutes``, 0 for none), whichever is spent faster."""

    d_model: int
    warmup: int
    scale: float = 1.0
    cooldown: float = 0.0
    max_steps: int = 1
    max_minutes: float = 0.0

    def rate(self, step: int, *, seconds: float) -> float:
        """The rate of update ``step`` (from 1) after ``seconds`` of training."""
        lr = inverse_sqrt_lr(step, d_model=self.d_model, warmup=self.warmup, scale=self.scale)
        if self.cooldown:
            used = (step - 1) / self.max_steps
            if self.max_minutes:
                used = max(used, seconds / (self.max_minutes * 60))
            lr *= cooldown_factor(used, self.cooldown)
        return lr
