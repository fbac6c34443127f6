"""Objective registry: stage name -> objective class.

The one place that knows every objective. Objective modules import only the base
(stages.objective), never this registry, so importing it creates no loop.
"""
from __future__ import annotations

from core.errors import UsageError
from stages.cpt import CptObjective
from stages.rl.objective import RlObjective
from stages.rm import RmObjective
from stages.sft import SftObjective

OBJECTIVES = {cls.name: cls for cls in (CptObjective, SftObjective, RmObjective, RlObjective)}


def objective_class(stage: str):
    """The objective class that trains `stage`; an unknown name is a usage error."""
    try:
        return OBJECTIVES[stage]
    except KeyError:
        raise UsageError("stage", stage, f"expected one of {', '.join(OBJECTIVES)}") from None
