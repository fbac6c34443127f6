"""Write a small dataset for every stage, in every format baton reads.

    python examples/own_data/make_data.py runs/own-data/data [--model runs/own-data/model]

CPT: text rows as two JSON Lines shards (a glob) and a held-out file (JSON Lines and
Parquet). SFT: chat `messages` in Parquet, and prompt/completion pairs in JSON with
columns of your own names. RM: preference pairs as a `datasets.save_to_disk` directory
(strings) and as chat message lists in JSON Lines. RL: prompts with a ground-truth
`answer` and a `level` column your reward function receives in extra_info, and held-out
prompts as chat message lists in JSON. `--model` also writes a tiny
random Qwen2-style model (a BPE tokenizer, a ChatML template) to try it all offline.
"""
from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SYSTEM = {"role": "system", "content": "Answer with the number."}
WORDS = {"plus": lambda a, b: a + b, "minus": lambda a, b: a - b, "times": lambda a, b: a * b}


def problems(seed: int, count: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        a, b, word = rng.randint(0, 20), rng.randint(0, 20), rng.choice(sorted(WORDS))
        rows.append((f"What is {a} {word} {b}?", WORDS[word](a, b)))
    return rows


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def write_all(out: Path, rows: int = 120) -> dict[str, Path]:
    """Every dataset under `out`; returns where each one is (the config's paths)."""
    import datasets

    qa = problems(0, rows)
    held = problems(1, 24)
    text = [{"text": f"{q} The answer is {a}."} for q, a in qa]
    _jsonl(out / "cpt" / "part-0.jsonl", text[::2])
    _jsonl(out / "cpt" / "part-1.jsonl", text[1::2])
    held_text = [{"text": f"{q} The answer is {a}."} for q, a in held]
    _jsonl(out / "cpt" / "eval.jsonl", held_text)
    datasets.Dataset.from_list(held_text).to_parquet(str(out / "cpt" / "eval.parquet"))
    chats = [{"messages": [SYSTEM, {"role": "user", "content": q}, {"role": "assistant", "content": str(a)}]}
             for q, a in qa]
    (out / "sft").mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(chats).to_parquet(str(out / "sft" / "chats.parquet"))
    (out / "sft" / "qa.json").write_text(json.dumps([{"question": q, "response": str(a)} for q, a in qa]))
    pairs = [{"prompt": q, "chosen": str(a), "rejected": str(a + 1)} for q, a in qa]
    datasets.Dataset.from_list(pairs).save_to_disk(str(out / "rm" / "pairs"))
    _jsonl(out / "rm" / "chat_pairs.jsonl", [
        {"chosen": [{"role": "user", "content": q}, {"role": "assistant", "content": str(a)}],
         "rejected": [{"role": "user", "content": q}, {"role": "assistant", "content": str(a + 1)}]}
        for q, a in qa])
    _jsonl(out / "rl" / "prompts.jsonl", [{"question": q, "answer": a, "level": len(q) % 3}
                                          for q, a in qa])
    (out / "rl" / "eval.json").write_text(json.dumps([
        {"question": [SYSTEM, {"role": "user", "content": q}], "answer": a, "level": len(q) % 3}
        for q, a in held]))
    return {"cpt": out / "cpt" / "part-*.jsonl", "cpt_eval": out / "cpt" / "eval.jsonl",
            "cpt_eval_parquet": out / "cpt" / "eval.parquet",
            "sft_messages": out / "sft" / "chats.parquet", "sft_pairs": out / "sft" / "qa.json",
            "rm_saved": out / "rm" / "pairs", "rm_chats": out / "rm" / "chat_pairs.jsonl",
            "rl": out / "rl" / "prompts.jsonl", "rl_eval_chats": out / "rl" / "eval.json"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for the datasets")
    parser.add_argument("--model", type=Path, help="also write a tiny Qwen2-style model here")
    args = parser.parse_args()
    for name, path in write_all(args.out).items():
        print(f"{name:16s} {path}")
    if args.model:
        from bench.tiny_hf_model import build_tiny_model
        print(f"{'model':16s} {build_tiny_model(args.model, 'qwen2')}")


if __name__ == "__main__":
    main()
