"""`python -m repro.export ckpt=... format=...`: see repro.export.command."""

from repro.core.runtime.launch import start

start("repro.export")  # before torch is imported, so the re-exec costs next to nothing

import sys  # noqa: E402

from repro.export.command import main  # noqa: E402

main(sys.argv[1:])
