"""Eight processes write to one store at once, on SQLite and on PostgreSQL."""
from __future__ import annotations

import multiprocessing
import queue

from lineage_concurrency_worker import (CHECKPOINTS_PER_RUN, ROUNDS, open_fresh, record)

WORKERS = 8


def _run_all(target, args_for) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=args_for(i, ctx)) for i in range(WORKERS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    for p in procs:
        if p.is_alive():
            p.kill()
    return procs


def _drain(q) -> list:
    items = []
    while True:
        try:
            items.append(q.get(timeout=0.5))
        except queue.Empty:
            return items


def test_eight_writers_lose_and_duplicate_nothing_and_number_attempts_uniquely(db_url):
    from lineage.store import LineageStore
    with LineageStore.open(db_url) as store:
        pipeline = store.record_pipeline_run("concurrent", {}, "h", 1, "v")
    ctx = multiprocessing.get_context("spawn")
    barrier, errors = ctx.Barrier(WORKERS), ctx.Queue()
    procs = _run_all(record, lambda i, _: (db_url, pipeline.id, i, barrier, errors))
    problems = _drain(errors)
    assert not problems, "\n".join(problems)
    assert [p.exitcode for p in procs] == [0] * WORKERS

    with LineageStore.open(db_url) as store:
        runs = store.stage_runs(pipeline.id)
        assert len(runs) == WORKERS * ROUNDS
        assert sorted(r.attempt for r in runs) == list(range(1, WORKERS * ROUNDS + 1))
        assert all(r.status == "completed" for r in runs)
        paths = [c.path for r in runs for c in store.checkpoints(r.id)]
        assert len(paths) == len(set(paths)) == WORKERS * ROUNDS * CHECKPOINTS_PER_RUN
        events = [e for r in runs for e in store.events(r.id)]
        assert sorted((e.detail["worker"], e.detail["round"]) for e in events) == [
            (w, i) for w in range(WORKERS) for i in range(ROUNDS)]


def test_eight_processes_opening_a_fresh_store_migrate_it_exactly_once(db_url):
    from lineage.schema import code_head
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(WORKERS), ctx.Queue()
    procs = _run_all(open_fresh, lambda i, _: (db_url, barrier, results))
    revisions = _drain(results)
    assert revisions == [code_head()] * WORKERS, revisions
    assert [p.exitcode for p in procs] == [0] * WORKERS
