"""One module per knob: each reads its config group and applies it, nothing else."""
