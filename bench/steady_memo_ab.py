"""What the steady-state snapshot (ckpt.steady_memo) saves the training thread per save.

    python -m bench.steady_memo_ab [--rounds 8] [--saves 10] [--saver thread|process] [overrides]

The default model trains with a baton save after every step (`ckpt.mode=async`), in
blocks of `--saves` saves with the memo and without it (`BatonCheckpointEngine.steady_memo`),
interleaved `--rounds` times, every other round in reverse order. Each block starts with
one save that is not counted: after a switch the memo holds nothing yet. It prints the
save call's (`Checkpointer.save`) min and median milliseconds both ways, and their ratio.
The saves in flight are drained after each block, so the blocks do not pay for each other.
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def measure(rounds: int, saves: int, saver: str, overrides: list[str]) -> dict[str, list[float]]:
    from bench.console import progress, stdout_to_stderr
    from bench.every_step import SavingTrainer
    from bench.state import build_state

    workdir = Path(tempfile.mkdtemp(prefix="baton-steady-memo-"))
    calls: dict[str, list[float]] = {"memo": [], "full": []}
    try:
        with stdout_to_stderr():
            state = build_state("default model", overrides, workdir / "model", None)
            trainer = SavingTrainer(state, workdir / "checkpoints", "async", saver)
        checkpointer = trainer.checkpointer

        def block(kind: str) -> None:
            checkpointer.io.steady_memo = kind == "memo"
            with stdout_to_stderr():
                trainer.train_and_save(1)  # the first save after a switch fills the memo
                for _ in range(saves):
                    trainer.train(1)
                    started = time.perf_counter()
                    checkpointer.save(trainer.step, _payload(trainer))
                    calls[kind].append(time.perf_counter() - started)
                checkpointer.drain()

        try:
            for index in range(rounds):
                for kind in (("memo", "full") if index % 2 == 0 else ("full", "memo")):
                    block(kind)
                progress(f"steady memo round {index + 1}/{rounds}: save call median "
                         f"{statistics.median(calls['memo'][-saves:]) * 1e3:.2f} ms with the memo, "
                         f"{statistics.median(calls['full'][-saves:]) * 1e3:.2f} ms without")
        finally:
            with stdout_to_stderr():
                checkpointer.close()
                state.close()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return calls


def _payload(trainer):
    from bench.methods.baton_checkpointer import payload
    return payload(trainer.step, trainer.tokens_per_step)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.steady_memo_ab",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--saves", type=int, default=10, help="counted saves per block")
    parser.add_argument("--saver", choices=("thread", "process"), default="process")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error(f"--rounds must be at least 3 for a min and a median (got {args.rounds})")
    if args.saves < 1:
        parser.error(f"--saves must be at least 1 (got {args.saves})")
    calls = measure(args.rounds, args.saves, args.saver, args.overrides)
    ms = {kind: (min(v) * 1e3, statistics.median(v) * 1e3) for kind, v in calls.items()}
    print(f"default model, ckpt.saver={args.saver}, {len(calls['memo'])} saves each way "
          f"in {args.rounds} interleaved rounds")
    print(f"save call, min / median: {ms['memo'][0]:.3f} / {ms['memo'][1]:.3f} ms with the memo, "
          f"{ms['full'][0]:.3f} / {ms['full'][1]:.3f} ms without; "
          f"ratio {ms['memo'][0] / ms['full'][0]:.3f} / {ms['memo'][1] / ms['full'][1]:.3f}")


if __name__ == "__main__":
    main()
