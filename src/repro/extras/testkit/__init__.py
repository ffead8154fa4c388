"""A project's parts against the engine's promises (docs/engine.md, "The test kit").

`from repro.extras.testkit.checks import *` in a project's test module runs every check on every
option of the project's own conf/ (the plugin, `repro.extras.testkit.plugin`, finds them). Outside the
core: the engine's loop never imports it, and it imports pytest only when a test suite runs.
"""
