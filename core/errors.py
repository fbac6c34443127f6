"""User-facing errors. Each carries the data needed to act on it."""
from __future__ import annotations


class BatonError(Exception):
    """Base of every error baton reports to a user (exit code 2 in the CLI)."""


class ConfigError(BatonError):
    """One or more configuration problems, all reported together."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{len(self.problems)} configuration error(s):\n{lines}")


class UsageError(BatonError):
    """A command-line argument that cannot be used as given."""

    def __init__(self, argument: str, value: object, expected: str):
        self.argument, self.value, self.expected = argument, value, expected
        super().__init__(f"{argument}={value!r}: {expected}")
