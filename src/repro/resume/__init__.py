"""`python -m repro.resume PATH`: finish what a run or a sweep left undone, each job resuming
exactly from its checkpoint (`command`: the entry point). A tool beside the core, as `export` is:
the core never imports it."""
