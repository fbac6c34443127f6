"""Builds the native parts (csrc/); all other metadata is in pyproject.toml.

- `core._ieee_sqrt`: IEEE square roots in place of MKL's vector-math ones, which portable
  mode loads into every process (core/ieee_sqrt.py). Plain C, no dependency but libm.
- `ckpt._native_writer`: the optional native checkpoint writer.

The extension is optional: where it cannot be built (no compiler, no OpenSSL or xxhash
headers, no pybind11), `pip install` still succeeds and ckpt.writers falls back to the pure-Python
writer with a one-line notice. See docs/native_writer.md.
"""
from setuptools import Extension, setup


def ieee_sqrt() -> Extension:
    # A plain shared library (no Python module init): core.ieee_sqrt loads it with ctypes.
    # -fno-math-errno: a negative input gives NaN as MKL does, with no libm call; -O3: the
    # loop becomes SSE2 sqrtps, four at a time (correctly rounded at any width).
    return Extension("core._ieee_sqrt", ["csrc/ieee_sqrt.c"], extra_compile_args=["-O3", "-fno-math-errno"],
                     libraries=["m"], optional=True)


def native_extensions() -> list[Extension]:
    try:
        import pybind11
    except ImportError as exc:  # e.g. --no-build-isolation without pybind11 installed
        print(f"baton: not building ckpt._native_writer ({exc})")
        return []
    return [Extension(
        "ckpt._native_writer",
        ["csrc/native_writer.cpp"],
        include_dirs=[pybind11.get_include()],
        libraries=["crypto", "xxhash"],  # OpenSSL sha256, libxxhash xxh3-128
        extra_compile_args=["-O3", "-std=c++17"],
        optional=True,
    )]


setup(ext_modules=[ieee_sqrt(), *native_extensions()])
