"""`python -m repro.shards`: the command lives in repro.shards.command."""

import sys

from repro.core.runtime.launch import start

start("repro.shards", hash_seed=False)  # rebuilds no run: no hash seed to pin

from repro.shards.command import main  # noqa: E402

main(sys.argv[1:])
