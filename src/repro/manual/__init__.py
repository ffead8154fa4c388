"""The engine's documentation, shipped in its wheel: a project generated from the template has
no template checkout, and its README is short, so the full docs travel with the engine it
pins (the same commit's README.md and docs/*.md). `python -m repro.manual` lists them."""
