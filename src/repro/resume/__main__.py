"""`python -m repro.resume PATH [force=true]`: see repro.resume.command."""

import sys

from repro.resume.command import main

main(sys.argv[1:])
