"""Builds the native parts (csrc/); all other metadata is in pyproject.toml.

- `core._mkl_preload`: what portable mode loads ahead of MKL into every process (MKL's
  AVX2 branch on any vendor's CPU, IEEE square roots; core/mkl_preload.py). Plain C, libm only.
- `ckpt._native_writer`: the optional native checkpoint writer.

The extension is optional: where it cannot be built (no compiler, no OpenSSL or xxhash
headers, no pybind11), `pip install` still succeeds and ckpt.writers falls back to the pure-Python
writer with a one-line notice. See docs/native_writer.md.
"""
from setuptools import Extension, setup


def mkl_preload() -> Extension:
    # A plain shared library (no Python module init): core.mkl_preload loads it with ctypes.
    # -fno-math-errno: a negative input gives NaN as MKL does, with no libm call; -O3: the
    # loop becomes SSE2 sqrtps, four at a time (correctly rounded at any width).
    return Extension("core._mkl_preload", ["csrc/mkl_preload.c"], extra_compile_args=["-O3", "-fno-math-errno"],
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


setup(ext_modules=[mkl_preload(), *native_extensions()])
