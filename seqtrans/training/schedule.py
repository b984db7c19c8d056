"""The learning-rate schedule of section 5.3: linear warm-up, then inverse square root;
optionally a linear cool-down to zero at the end of a fixed budget."""

from __future__ import annotations


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
