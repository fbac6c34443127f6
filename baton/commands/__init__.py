"""One module per `baton` command: `add_arguments(parser)` and `main(args) -> exit code`.

Top-level imports stay light; heavy libraries are imported inside `main`.
"""
