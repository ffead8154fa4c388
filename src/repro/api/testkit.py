"""The test kit's checks, for a project's tests: `from repro.api.testkit import *` in
tests/test_parts.py runs every check on the project's own conf/ options (docs/engine.md)."""

from repro.extras.testkit.checks import *  # noqa: F403
from repro.extras.testkit.checks import __all__  # noqa: F401
