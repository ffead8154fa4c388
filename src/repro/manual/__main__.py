"""`python -m repro.manual [NAME]`: the command lives in repro.manual.command."""

import sys

from repro.core.runtime.launch import start

start("repro.manual", hash_seed=False)  # rebuilds no run: no hash seed to pin

from repro.manual.command import main  # noqa: E402

main(sys.argv[1:])
