"""Sharded datasets: tar shards with a manifest (format), where they live (store), the `data`
option that reads them (dataset) and the command that makes them (pack, __main__)."""
