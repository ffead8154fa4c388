"""One module per knob: each reads its config group and applies it, nothing else; and
`launch`, what an entry point does before Hydra parses (hash seed, seed shorthand, run names)."""
