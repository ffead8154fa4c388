"""`python -m repro.resume PATH [force=true]`: see repro.resume.command."""

import sys

from repro.core.runtime.launch import start

start("repro.resume", hash_seed=False)  # rebuilds no run: no hash seed to pin

from repro.resume.command import main  # noqa: E402

main(sys.argv[1:])
