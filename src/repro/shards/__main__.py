"""`python -m repro.shards`: the command lives in repro.shards.command."""

import sys

from repro.shards.command import main

main(sys.argv[1:])
