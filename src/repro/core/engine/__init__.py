"""The training loop and what it leans on: checkpoints, metrics, loggers, schedules."""
