"""What watches a run without changing it: metrics rows, trackers, the progress bar, the
profiler and sync debugging, throughput and the log file."""
