"""repro: a Hydra-configured image-classification template, bit-exact and fast."""

__version__ = "0.1.0"
