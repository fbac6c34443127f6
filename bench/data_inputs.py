"""What `baton bench data` measures on: a synthetic chat dataset, a tiny model with a real
tokenizer, and a large tokenized dataset in the layout stages.data.prepare writes.

Everything is generated here, seeded, with nothing downloaded: the same arguments give
the same bytes.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ("the model learns to add small numbers and answer short questions about cats dogs "
         "birds trees rivers what is the sum please tell me one two three four five six seven "
         "eight nine ten a quick brown fox jumps over the lazy dog while children read books").split()


def chat_rows(path: Path, rows: int, seed: int = 0) -> Path:
    """`rows` JSON lines of {"messages": [system?, user, assistant, (user, assistant)?]}:
    one or two turns, 5 to 40 words each, so rows have the spread of lengths real chats have."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as out:
        for _ in range(rows):
            messages = [{"role": "system", "content": "Answer briefly."}] if rng.random() < 0.3 else []
            for _turn in range(rng.choice((1, 1, 2))):
                a, b = rng.randint(0, 999), rng.randint(0, 999)
                messages.append({"role": "user", "content": f"What is {a} plus {b}? "
                                 + " ".join(rng.choices(WORDS, k=rng.randint(5, 40)))})
                messages.append({"role": "assistant", "content": f"The answer is {a + b}. "
                                 + " ".join(rng.choices(WORDS, k=rng.randint(5, 40)))})
            out.write(json.dumps({"messages": messages}) + "\n")
    return path


def tokenized_dataset(root: Path, gigabytes: float, seq: int = 256, vocab: int = 512) -> dict:
    """A tokenized SFT dataset of about `gigabytes` on disk (input_ids and labels as int64
    lists of `seq` tokens: what `datasets.map` writes for lists of Python ints), as
    `save_to_disk` directories, and the data plan that points at them (stages.data.examples
    reads its `cache` paths)."""
    import datasets
    import numpy as np
    import pyarrow as pa

    rows = max(int(gigabytes * 1e9 / (seq * 8 * 2)), 1)
    values = pa.array(np.random.default_rng(0).integers(0, vocab, size=rows * seq, dtype=np.int64))
    offsets = pa.array(np.arange(0, rows * seq + 1, seq, dtype=np.int64))
    ids = pa.LargeListArray.from_arrays(offsets, values)
    table = pa.table({"input_ids": ids, "labels": ids, "length": pa.array(np.full(rows, seq))})
    plan = {}
    for split, part in (("train", table), ("eval", table.slice(0, 64))):
        target = root / split
        datasets.Dataset(part).save_to_disk(str(target))
        plan[split] = {"cache": str(target), "rows": part.num_rows}
    return plan


def disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())
