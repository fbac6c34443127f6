"""`baton` command line: parse, dispatch to one command module, map errors to exit codes.

Trailing `key=value` arguments are Hydra overrides of `conf/pipeline.yaml`; every
command accepts them (`run.dir=…`, `store.url=…`), and `--config FILE` reads a YAML file
of them first (core.config.config_file). Exit codes: 0 ok, 1 a check
failed (verify / diff / rerun verdict), 2 bad input (config, paths, records), 3 an
internal error (a bug: BATON_DEBUG=1 shows its traceback).
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys

from core.errors import BatonError, UsageError

DEBUG_ENV = "BATON_DEBUG"
# A Hydra override's key (`stage.max_steps=`, `+x=`, `selection@pipeline.handoffs.a.selection=`):
# no spaces or slashes, so an option's value such as `--why "pinned MKL_CBWR=X"` or a path
# with an `=` in it stays an argument.
OVERRIDE_KEY = re.compile(r"[+~]{0,2}[A-Za-z_][\w.@\-]*=")

# command -> (module, help). Modules are imported only when their command runs, so
# `baton ckpt verify` does not pay for importing DeepSpeed or MLflow.
COMMANDS = {
    "run": ("baton.commands.run", "run the whole pipeline (CPT -> SFT -> RM -> RL)"),
    "stage": ("baton.commands.stage", "run one stage's workers: baton stage cpt|sft|rm|rl [overrides]"),
    "ckpt": ("baton.commands.ckpt", "verify | inspect | diff | reshard | adopt | export | gc checkpoints"),
    "lineage": ("baton.commands.lineage", "show | trace | handoff | study: browse the lineage store"),
    "db": ("baton.commands.db", "upgrade | current: manage the lineage schema"),
    "ui": ("baton.commands.ui", "start the MLflow UI on 127.0.0.1 against the run's store"),
    "report": ("baton.commands.report", "a pipeline run's results as markdown, from its records"),
    "rerun": ("baton.commands.rerun", "re-run a stage from a recorded handoff and compare"),
    "rl": ("baton.commands.rl", "replay: re-apply journaled RL steps and compare | journal show"),
    "probe": ("baton.commands.probe", "hash each operation a stage computes, compare with a "
              "recorded probe (another CPU, the golden values) and name what differs"),
    "config": ("baton.commands.config", "print the resolved config for the given overrides"),
    "study": ("baton.commands.study", "selection: RL from each SFT checkpoint; which diagnostic predicts RL"),
    "bench": ("baton.commands.bench", "ckpt: time every checkpoint save method on the same state; "
              "repro, batch-invariant: what a mode costs per training step"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="baton", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        module = importlib.import_module(module_name)
        cmd = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(cmd)
        cmd.set_defaults(_module=module)
    return parser


def take_config_files(argv: list[str]) -> tuple[list[str], list[str]]:
    """(argv without `--config FILE` / `--config=FILE`, those files' overrides in order)."""
    from core.config.config_file import file_overrides

    rest, overrides, items = [], [], iter(argv)
    for item in items:
        if item == "--config":
            path = next(items, None)
            if path is None:
                raise UsageError("--config", "", "expected a YAML file of settings after --config")
            overrides += file_overrides(path)
        elif item.startswith("--config="):
            overrides += file_overrides(item.split("=", 1)[1])
        else:
            rest.append(item)
    return rest, overrides


def split_overrides(argv: list[str]) -> tuple[list[str], list[str]]:
    """Separate Hydra overrides (key=value, not starting with '-') from CLI arguments."""
    args, overrides = [], []
    for item in argv:
        (overrides if OVERRIDE_KEY.match(item) else args).append(item)
    return args, overrides


def main(argv: list[str] | None = None) -> int:
    """`argv` None: this process is the `baton` command itself (its own process, which a
    command may configure, e.g. pin its CPU kernels); a list: called from other code."""
    own_process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    command = "baton"
    try:
        argv, from_files = take_config_files(argv)  # the command line's overrides win
        args_only, overrides = split_overrides(argv)
        overrides = from_files + overrides
        args = build_parser().parse_args(args_only)  # bad usage: SystemExit(2) with usage
        command = f"baton {args.command}"
        args.overrides, args.own_process = overrides, own_process
        return int(args._module.main(args) or 0)
    except BatonError as exc:
        print(f"{command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `baton ... | head`: the reader left; not an error worth a word
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # quiet exit flush
        return 141
    except Exception as exc:  # last resort: anything not turned into a BatonError is a bug
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            raise
        print(internal_error(command, exc), file=sys.stderr)
        return 3


def internal_error(command: str, exc: BaseException) -> str:
    """One paragraph for an unexpected exception: what it was, that it is baton's fault,
    and how to get the traceback for a bug report."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    message = " ".join(lines[:3])[:500] or "(no message)"
    return (f"{command}: internal error: {type(exc).__name__}: {message}. This is a bug "
            f"in baton, not in your input; rerun with {DEBUG_ENV}=1 for the traceback and "
            "report it with that output")


if __name__ == "__main__":
    sys.exit(main())
