"""What lineage and MLflow record of the data a stage read: one record per dataset."""
from __future__ import annotations

SHARED = ("format", "max_length", "truncation", "loss_on", "tokenizer", "chat_template")


def dataset_records(plan: dict, rows_read: int) -> list[dict]:
    """The train and eval datasets of a data plan (stages.data.prepare) as flat records.
    `rows_read`: train rows consumed (repeats across epochs counted again)."""
    records = []
    for role in ("train", "eval"):
        split = plan[role]
        path = split.get("path") or f"{plan['train']['path']} (held-out {split['fraction']:g})"
        records.append({
            "role": role, "stage": plan["stage"], "path": path,
            "digest": split.get("digest") or plan["train"]["digest"],
            "rows": split["rows"], "keys": split.get("keys") or plan["train"].get("keys"),
            **{key: plan.get(key) for key in SHARED},
            "rows_read": rows_read if role == "train" else None,
            "allowed_change": plan.get("allowed_change")})
    return records
