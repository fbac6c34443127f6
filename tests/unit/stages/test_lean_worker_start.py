"""What a launch and a worker skip at start-up, without changing what they compute:
the launcher reads torch's build instead of importing torch, and a worker imports
DeepSpeed while mlflow is hidden from it (stages.lean_start)."""
from __future__ import annotations

import sys

import pytest

from stages.lean_start import hidden
from stages.worker_env import built_for_gpu


@pytest.mark.parametrize("line,gpu", [
    ("cuda: Optional[str] = None", False),
    ("cuda: Optional[str] = '12.4'", True),
    ("hip: Optional[str] = '6.2.41133-dd7f95766'", True),
    ("cuda = None", False),
    ('cuda = "11.8"', True),
    ("rocm: Optional[str] = None", False),
])
def test_a_gpu_build_of_torch_is_read_off_its_version_file(line, gpu):
    assert built_for_gpu(f"__version__ = '2.13.0'\n{line}\n") is gpu


def test_a_hidden_module_cannot_be_imported_inside_and_imports_after():
    sys.modules.pop("colorsys", None)  # a standard module: stands in for mlflow
    with hidden("colorsys"), pytest.raises(ImportError):
        import colorsys  # noqa: F401
    assert "colorsys" not in sys.modules  # the marker is gone afterwards
    import colorsys  # noqa: F401,F811
    assert sys.modules["colorsys"] is colorsys


def test_an_imported_module_is_left_alone():
    import json

    with hidden("json"):
        import json as inside  # noqa: F401
    assert inside is json and sys.modules["json"] is json

