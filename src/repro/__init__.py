"""repro: a Hydra-configured image-classification template, bit-exact and fast."""

from repro.core import relocated

__version__ = "0.1.0"

relocated.install()  # a project's old imports (repro.data, repro.objectives ...) still work
