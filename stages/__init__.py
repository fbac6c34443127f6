"""Stage objectives (cpt, sft, rm, rl), the shared worker loop, the built-in model and tasks."""
