"""skeleton: an experiment on the repro engine. Its parts plug into the engine's seams, named by
`_target_` in conf/: a dataset (stripes.py), an objective term (logit_penalty.py) and a
callback (confusion.py)."""
