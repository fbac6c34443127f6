"""`baton bench data`: what training on your own data costs, each number against a named
baseline measured in the same run (docs/bench.md, "Your data").

- **tokenize**: baton's preparation of a chat dataset (stages.data.prepare: JSON check,
  chat template, assistant-token labels, length check, held-out split, cache) against a
  plain `datasets.load_dataset` + `datasets.map` of `apply_chat_template` with the same
  tokenizer, batch size and processes, both from the same JSON lines file, each reading it
  into a new Arrow cache of its own as a first run does. Rounds alternate which goes
  first; throughput ratio baton ÷ plain, min and median.
- **cache**: preparing the same data again (the cache is found and read) ÷ the first time.
- **memory**: the memory a fresh process gains reading micro-batches the way a worker does
  (sampler order, stages.objective's collation) from a tokenized dataset of `--memory-gb`
  (memory-mapped), against the dataset's size. Its own (anonymous) resident memory is what
  loading the dataset would grow; the file pages it touches are counted in its RSS too, but
  they are the kernel's page cache, shared and reclaimable, and reported apart.
- **loading**: a real SFT stage on the prepared data: the time each step spends reading and
  collating its micro-batches (`data_seconds` in metrics.jsonl) ÷ the step's time.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.data_inputs import chat_rows, disk_bytes, tokenized_dataset

BATCH_SIZE = 500  # what stages.data.prepare hands datasets.map


def _plain_map(data: Path, model_dir: Path, processes: int | None, hf_cache: Path, out: Path) -> None:
    """The baseline: what one writes without baton to tokenize chat rows."""
    import datasets
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    rows = datasets.load_dataset("json", data_files=str(data), split="train", cache_dir=str(hf_cache))
    rows.map(lambda batch: {"input_ids": tokenizer.apply_chat_template(batch["messages"], tokenize=True)["input_ids"]},
             batched=True, batch_size=BATCH_SIZE, num_proc=processes, remove_columns=rows.column_names,
             load_from_cache_file=False, cache_file_name=str(out))


def _data_overrides(data: Path, model_dir: Path, cache: Path) -> list[str]:
    """The chat data, the model and the cache, as both the preparation and the stage see them
    (the same overrides give the same cache key)."""
    return [f"model.path={model_dir}", f"data.sft.train.path={data}", "data.sft.train.format=messages",
            "data.sft.eval_fraction=0.01", "data.max_length=256", f"data.cache_dir={cache}"]


def _config(data: Path, model_dir: Path, cache: Path, run_dir: Path, overrides: list[str]):
    from core.config import compose

    return compose(["stage=sft", f"run.dir={run_dir}", *_data_overrides(data, model_dir, cache),
                    "mlflow.enabled=false", *overrides])


def tokenize_rounds(data: Path, model_dir: Path, work: Path, rounds: int, overrides: list[str],
                    progress) -> dict:
    from stages.data.prepare import PARALLEL_FROM_ROWS, prepare_data

    rows = sum(1 for _ in open(data))
    processes = min(os.cpu_count() or 1, 8) if rows >= PARALLEL_FROM_ROWS else None
    plain, baton, cached = [], [], []
    for index in range(rounds):
        def time_plain() -> None:
            started = time.perf_counter()
            _plain_map(data, model_dir, processes, work / f"hf-plain-{index}", work / f"plain-{index}.arrow")
            plain.append(time.perf_counter() - started)

        def time_baton() -> None:
            cfg = _config(data, model_dir, work / f"cache-{index}", work / "run", overrides)
            started = time.perf_counter()
            prepare_data(cfg, model_dir)
            baton.append(time.perf_counter() - started)
            started = time.perf_counter()
            prepare_data(cfg, model_dir)  # the same data again: found in the cache
            cached.append(time.perf_counter() - started)

        for timed in ((time_plain, time_baton) if index % 2 == 0 else (time_baton, time_plain)):
            timed()
        progress(f"[bench data] tokenize round {index + 1}/{rounds}: plain {plain[-1]:.1f} s, "
                 f"baton {baton[-1]:.1f} s, baton from its cache {cached[-1]:.2f} s")
    ratios = [p / b for p, b in zip(plain, baton)]
    return {"rows": rows, "processes": processes or 1, "plain_s": plain, "baton_s": baton,
            "cached_s": cached, "throughput_ratio": {"min": min(ratios), "median": statistics.median(ratios)},
            "cache_share": {"max": max(c / b for c, b in zip(cached, baton)),
                            "median": statistics.median(c / b for c, b in zip(cached, baton))}}


READER = """
import json, resource, sys
from types import SimpleNamespace
from transformers import AutoTokenizer
from stages.data.examples import FileExamples
from stages.objective import CausalLMObjective
from stages.sampler import GlobalSampler
from stages.tasks import TRAIN

def rss():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "RssAnon", "RssFile")}

plan, model_dir, steps, global_batch, micro = json.loads(sys.argv[1])
tokenizer = AutoTokenizer.from_pretrained(model_dir)
examples = FileExamples(plan)
stage = SimpleNamespace(name="sft", seq_len=256, micro_batch=micro, eval_samples=8)
objective = CausalLMObjective(stage, tokenizer, None, examples)
sampler = GlobalSampler(examples.size(TRAIN), global_batch, micro, 1, 1234)
objective.batch(TRAIN, sampler.micro_batch_indices(0, 0, 0))  # imports and first-call set-up
before = rss()
for step in range(steps):
    for m in range(sampler.accumulation_steps):
        objective.batch(TRAIN, sampler.micro_batch_indices(step, m, 0))
    sampler.advance_to_step(step + 1)
after = rss()
print(json.dumps({"before": before, "after": after}))
"""


def memory(model_dir: Path, work: Path, gigabytes: float, steps: int, progress) -> dict:
    started = time.perf_counter()
    plan = tokenized_dataset(work / "large", gigabytes)
    size = disk_bytes(work / "large" / "train")
    progress(f"[bench data] wrote a {size / 1e9:.2f} GB tokenized dataset in "
             f"{time.perf_counter() - started:.0f} s; reading {steps} steps of it as a worker does")
    done = subprocess.run([sys.executable, "-c", READER, json.dumps([plan, str(model_dir), steps, 16, 4])],
                          capture_output=True, text=True, check=True)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    grown = {key: found["after"][key] - found["before"][key] for key in found["after"]}
    return {"dataset_bytes": size, "steps": steps, "rows_read": steps * 16, "grown": grown,
            "before": found["before"], "after": found["after"]}


def loading(data: Path, model_dir: Path, work: Path, steps: int, overrides: list[str]) -> dict:
    """A real SFT stage on the prepared data (the cache of the tokenize rounds): each step's
    data_seconds ÷ its seconds, leaving out the first step (start-up)."""
    run_dir = work / "stage"
    command = [sys.executable, "-m", "baton.cli", "stage", "sft", f"run.dir={run_dir}",
               *_data_overrides(data, model_dir, work / "cache-0"),
               f"stage.max_steps={steps}", f"stage.eval_every={steps + 1}", f"stage.save_every={steps + 1}",
               "stage.seq_len=256", "mlflow.enabled=false", *overrides]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bench data: `{' '.join(command)}` failed ({done.returncode}):\n" + done.stderr[-2000:])
    records = [json.loads(line) for line in (run_dir / "sft" / "metrics.jsonl").read_text().splitlines()]
    shares = [r["data_seconds"] / r["seconds"] for r in records if r["step"] > 1 and r.get("seconds")]
    steps_s = [r["seconds"] for r in records if r["step"] > 1]
    return {"steps_timed": len(shares), "step_s_median": statistics.median(steps_s),
            "data_s_median": statistics.median(r["data_seconds"] for r in records if r["step"] > 1),
            "share": {"median": statistics.median(shares), "max": max(shares)}}


def run_data_bench(rows: int, rounds: int, memory_gb: float, memory_steps: int, stage_steps: int,
                   work: Path, overrides: list[str], progress=print) -> dict:
    from bench.machine import machine_info
    from bench.tiny_hf_model import build_tiny_model

    model_dir = build_tiny_model(work / "model", "qwen2")
    started = time.perf_counter()
    data = chat_rows(work / "chats.jsonl", rows)
    progress(f"[bench data] wrote {rows:,} chat rows ({data.stat().st_size / 1e6:.0f} MB) in "
             f"{time.perf_counter() - started:.1f} s")
    result = {"machine": machine_info(work), "model": "bench.tiny_hf_model qwen2",
              "tokenize": tokenize_rounds(data, model_dir, work, rounds, overrides, progress)}
    progress("[bench data] an SFT stage on the prepared data")
    result["loading"] = loading(data, model_dir, work, stage_steps, overrides)
    result["memory"] = memory(model_dir, work, memory_gb, memory_steps, progress)
    return result


BARS = {"tokenize": 0.9, "cache": 0.05, "loading": 0.02, "memory_mb": 300}
"""Issue 41's bars: throughput ratio at least, cache and loading shares and memory at most."""


def report_lines(result: dict) -> list[str]:
    m, t, ld, mem = result["machine"], result["tokenize"], result["loading"], result["memory"]
    grown = {key: value / 2**20 for key, value in mem["grown"].items()}

    def verdict(ok: bool) -> str:
        return "meets the bar" if ok else "MISSES the bar"
    ratio, cache, share = t["throughput_ratio"], t["cache_share"], ld["share"]
    return [
        f"baton bench data: {m['cpu_model']}, {m['cores']} cores; {t['rows']:,} chat rows, "
        f"{t['processes']} tokenizing process(es), {len(t['baton_s'])} rounds",
        f"  tokenize  baton ÷ plain datasets.map throughput: min {ratio['min']:.2f}, median "
        f"{ratio['median']:.2f} (plain {statistics.median(t['plain_s']):.1f} s, baton "
        f"{statistics.median(t['baton_s']):.1f} s median); bar >= {BARS['tokenize']}: "
        f"{verdict(ratio['min'] >= BARS['tokenize'])}",
        f"  cache     preparing again, from the cache ÷ the first time: median {cache['median']:.1%}, "
        f"max {cache['max']:.1%}; bar <= {BARS['cache']:.0%}: {verdict(cache['max'] <= BARS['cache'])}",
        f"  loading   reading and collating micro-batches ÷ the step: median {share['median']:.2%}, "
        f"max {share['max']:.2%} of a {ld['step_s_median'] * 1000:.0f} ms step ({ld['steps_timed']} "
        f"steps); bar <= {BARS['loading']:.0%}: {verdict(share['median'] <= BARS['loading'])}",
        f"  memory    reading {mem['rows_read']:,} rows of a {mem['dataset_bytes'] / 1e9:.2f} GB tokenized "
        f"dataset, the process's own memory grew {grown['RssAnon']:.0f} MB; bar <= {BARS['memory_mb']} MB: "
        f"{verdict(grown['RssAnon'] <= BARS['memory_mb'])} (loaded, it would hold "
        f"{mem['dataset_bytes'] / 2**20:,.0f} MB; the file's pages it touched, {grown['RssFile']:.0f} MB, "
        "are the kernel's page cache: shared, and freed under memory pressure)",
    ]


def markdown(result: dict, command: str) -> str:
    from core.fingerprint import code_version

    m = result["machine"]
    disk = m["filesystem"]
    disk = f"{disk.get('type')} on {disk.get('mount')}" if isinstance(disk, dict) else disk
    return "\n".join([
        f"# `baton bench data`, {time.strftime('%Y-%m-%d')}", "",
        f"`{command}` at commit {code_version()} on {m['cpu_model']} ({m['cores']} cores, "
        f"{m['memory_bytes'] / 2**30:.0f} GiB, {disk}), torch {m.get('torch_version')}, transformers "
        f"{m.get('transformers_version')}, datasets {m.get('datasets_version')}.", "",
        "```", *report_lines(result), "```", ""])
