"""The engine's config groups, a package so that Hydra's search path finds them from an
installed wheel (`pkg://repro.conf`: Hydra looks for this file)."""
