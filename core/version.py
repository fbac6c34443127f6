"""The installed baton version, readable from the lower layers.

Stages record it in their run files; reading it here (not from `baton`, the command
layer) keeps stages from importing the top of the stack.
"""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("baton")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.1.0"
