"""`baton bench ckpt`: every checkpoint save method measured on the same training state.

Nothing in baton imports this package except the `baton bench` command; it may import
ckpt, stages, core and lineage. How to run it and what the numbers mean: docs/bench.md.
"""
