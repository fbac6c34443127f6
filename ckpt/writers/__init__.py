"""Checkpoint file writers: `get_writer("native" | "python" | "auto")`.

The native writer (C++, csrc/) is built at install when a compiler and OpenSSL's headers
are there; where it is not, asking for it gives the Python twin and one logged line that
says why (`native_unavailable_reason()` returns the same text to callers).
"""
from __future__ import annotations

import functools
import logging

from ckpt.writers.base import Writer
from ckpt.writers.native import NativeWriter, load_extension
from ckpt.writers.python_writer import PythonWriter

__all__ = ["Writer", "get_writer", "native_unavailable_reason", "WRITER_NAMES"]

WRITER_NAMES = ("auto", "native", "python")
log = logging.getLogger(__name__)


def native_unavailable_reason() -> str | None:
    """None when the native writer is built and imports, else why not (the import error)."""
    return load_extension()[1]


def get_writer(name: str = "auto") -> Writer:
    """'native' | 'python' | 'auto' (native when built, else python, with one notice)."""
    if name not in WRITER_NAMES:
        raise ValueError(f"unknown checkpoint writer {name!r}: expected one of "
                         f"{', '.join(WRITER_NAMES)}")
    if name == "python":
        return PythonWriter()
    extension, reason = load_extension()
    if extension is not None:
        return NativeWriter(extension)
    _log_fallback_once(reason)
    return PythonWriter()


@functools.cache  # the reason never changes within a process: one line, once
def _log_fallback_once(reason: str) -> None:
    log.warning("native checkpoint writer unavailable (%s); using the Python writer "
                "(rebuild with `pip install -e .`, needs g++, libssl-dev and libxxhash-dev)", reason)
