"""Builds the optional native checkpoint writer (csrc/); all other metadata is in pyproject.toml.

The extension is optional: where it cannot be built (no compiler, no OpenSSL or xxhash
headers, no pybind11), `pip install` still succeeds and ckpt.writers falls back to the pure-Python
writer with a one-line notice. See docs/native_writer.md.
"""
from setuptools import Extension, setup


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


setup(ext_modules=native_extensions())
