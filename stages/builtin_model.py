"""`python -m stages.builtin_model DIR MODEL_JSON SEED REPRO_JSON`: create the built-in
model in a process pinned to `repro` (stages.model, when the caller's process is not)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from core.config.schema import ModelConfig, ReproConfig
from core.repro import apply_in_process
from stages.model import create_builtin

if __name__ == "__main__":
    directory, spec, seed, repro = sys.argv[1:5]
    apply_in_process(ReproConfig(**json.loads(repro)))  # its variables came from the parent
    create_builtin(ModelConfig(**json.loads(spec)), int(seed), Path(directory))
