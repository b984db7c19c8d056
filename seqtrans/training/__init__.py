"""Training: the loop, label-smoothed loss, the learning-rate schedule, checkpoints."""
