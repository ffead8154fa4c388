"""Optional parts, named by `_target_` or by their own entry points (docs/architecture.md)."""
