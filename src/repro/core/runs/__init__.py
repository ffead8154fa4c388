"""What outlives a process: checkpoints and their digests, resuming, the run folder's records,
its lock, stop signals, and reading a finished run's weights back (evaluate, predict, verify)."""
