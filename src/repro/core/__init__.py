"""The machinery every run uses (docs/architecture.md has the layers)."""
