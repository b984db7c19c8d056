"""Training: the loop and its parts (data order, update step, run log, stopping,
checkpoints, what data-parallel ranks agree on), the label-smoothed loss and the
learning-rate schedule."""
