"""Stage-boundary decisions: which checkpoint carries on (diagnostics + selection), whether
and where it is resharded, what carries over, and what a re-run compares."""
