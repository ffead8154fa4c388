"""`python -m repro.manual [NAME]`: the command lives in repro.manual.command."""

import sys

from repro.manual.command import main

main(sys.argv[1:])
