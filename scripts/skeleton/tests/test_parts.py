"""skeleton's parts against the engine's promises. The engine's test kit (repro.api.testkit, see
its docs/engine.md) runs each check on every option of conf/ it concerns: a dataset, objective,
experiment, callback or component added there as a YAML is checked without a test of its own.
"""

from repro.api.testkit import *  # noqa: F403
