"""`python -m repro.verify RUN_DIR ...` (repro.verify.command) or `--against REV ...`
(repro.verify.against)."""

from repro.core.runtime.launch import start

# Before torch is imported, so the re-exec costs next to nothing.
start("repro.verify")

import sys  # noqa: E402

if sys.argv[1:] and sys.argv[1].partition("=")[0] == "--against":  # no torch in this process
    from repro.verify.against import main
else:
    from repro.verify.command import main

main(sys.argv[1:])
