"""`baton probe [--stage] [--json PATH] [--compare PATH] [--record PATH --why TEXT] [overrides]`:
run the numerics probe (stages.numerics_probe) in this process's repro mode and print each
operation's digest; with `--stage`, also the content digest of a short CPT run.

`--compare` checks a recorded probe (the committed golden file, or another machine's
`--json`) and names every operation that differs: exit 1. `--record` is the only way the
golden values change: it writes this machine's probe and short stage with the reason
(`--why`, a deliberate numerics change), the machine and the date.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import sys
import tempfile
from pathlib import Path

from core.errors import BatonError

# The short stage whose checkpoint digest is part of a record.
SHORT_STAGE = ["stage.max_steps=4", "stage.save_every=4"]
GOLDEN = Path(__file__).resolve().parents[2] / "tests" / "golden" / "numerics-portable-avx2.json"


class ProbeRecordError(BatonError):
    pass


def add_arguments(parser) -> None:
    parser.add_argument("--stage", action="store_true",
                        help="also run a 4-step CPT stage and report its checkpoint's content digest")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH", help="write the probe as JSON")
    parser.add_argument("--compare", type=Path, default=None, metavar="PATH",
                        help=f"compare with a recorded probe and name what differs (exit 1); "
                        f"the golden file is {GOLDEN.relative_to(GOLDEN.parents[2])}")
    parser.add_argument("--record", type=Path, default=None, metavar="PATH",
                        help="write this machine's probe and short stage as the golden values "
                        "(needs --why)")
    parser.add_argument("--why", default=None, help="with --record: the deliberate numerics "
                        "change that makes new golden values right")


def main(args) -> int:
    if args.record is not None and not (args.why or "").strip():
        raise ProbeRecordError(
            f"--record {args.record}: no --why given. The golden values change only for a "
            "deliberate numerics change (a new kernel pin, a new torch); say which with "
            "--why \"...\", so the record tells the next reader why the values moved.")
    recorded = _read_record(args.compare) if args.compare is not None else None

    from core.config import compose
    from core.repro import apply_in_process, apply_to_environ

    cfg = compose(["stage=cpt", *args.overrides])
    if args.own_process:
        apply_to_environ(cfg.repro)  # before torch loads (it has not: commands import lazily)
    apply_in_process(cfg.repro)  # and the check that the kernels really are the pinned ones

    from stages import numerics_probe

    probe = {"probe": numerics_probe.PROBE_VERSION, "repro": _repro(cfg), "machine": _machine(cfg),
             "operations": numerics_probe.run(cfg)}
    if args.stage or args.record is not None:
        probe["stage"] = _short_stage(args.overrides)
    _print(probe)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(probe, indent=1) + "\n")
    if args.record is not None:
        record = {**probe, "why": args.why.strip(), "recorded": datetime.date.today().isoformat(),
                  "recorded_by": "baton probe --record"}
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=1) + "\n")
        print(f"[baton] recorded {args.record}: {args.why.strip()}")
    if recorded is not None:
        return _compare(recorded, probe, args.compare)
    return 0


def _repro(cfg) -> dict:
    return {"mode": cfg.repro.mode, "isa": cfg.repro.isa, "threads": cfg.repro.threads}


def _machine(cfg) -> dict:
    from core.fingerprint import collect

    found = collect(cfg.repro.mode, None)
    return {"cpu": found["cpu"]["model"], "flags": found["cpu"]["flags"],
            "cpu_capability": found["cpu_capability"], "mkl_branch": found["libraries"]["mkl_branch"],
            "sqrt": found["libraries"]["sqrt"],
            "versions": {k: found["versions"][k] for k in ("torch", "transformers", "python")}}


def _short_stage(overrides: list[str]) -> dict:
    from baton.commands.stage import prepare
    from ckpt.content_digest import content_digest_of
    from stages.launch import launch_stage

    with tempfile.TemporaryDirectory(prefix="baton-probe-") as run_dir:
        stage_overrides = [*overrides, *SHORT_STAGE, f"run.dir={run_dir}"]
        with contextlib.ExitStack() as locks:
            cfg, model_dir = prepare(stage_overrides, "cpt", locks)
            result = launch_stage(cfg, model_dir, None, inputs_checked=True)
        final = result.checkpoints[-1]
        return {"overrides": SHORT_STAGE, "step": final["step"],
                "content_digest": content_digest_of(final["path"])}


def _print(probe: dict) -> None:
    machine = probe["machine"]
    print(f"numerics probe v{probe['probe']}: repro.mode={probe['repro']['mode']} "
          f"repro.isa={probe['repro']['isa']}; {machine['cpu']}, ATen {machine['cpu_capability']}, "
          f"MKL code path {machine['mkl_branch']}, square root {machine.get('sqrt')}")
    width = max(len(name) for name in probe["operations"])
    for name, value in probe["operations"].items():
        print(f"  {name:<{width}}  {value}")
    if "stage" in probe:
        stage = probe["stage"]
        print(f"  {'short CPT stage, step ' + str(stage['step']):<{width}}  {stage['content_digest']}")


def _read_record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ProbeRecordError(
            f"--compare {path}: cannot read a recorded probe there ({exc}). Expected the JSON "
            "that `baton probe --json` or `--record` writes.") from None
    if not isinstance(record, dict) or not isinstance(record.get("operations"), dict):
        raise ProbeRecordError(
            f"--compare {path}: no 'operations' mapping in it. Expected the JSON that "
            "`baton probe --json` or `--record` writes.")
    return record


def _compare(recorded: dict, probe: dict, path: Path) -> int:
    from stages.numerics_probe import differing

    ops = differing(recorded["operations"], probe["operations"])
    stage_differs = ("stage" in recorded and "stage" in probe
                     and recorded["stage"]["content_digest"] != probe["stage"]["content_digest"])
    other = recorded.get("machine", {})
    where = f"{path} ({other.get('cpu', 'unknown CPU')}, MKL code path {other.get('mkl_branch')})"
    versions = other.get("versions", {})
    moved = [f"{name} {versions[name]} → {probe['machine']['versions'].get(name)}" for name in versions
             if versions[name] != probe["machine"]["versions"].get(name)]
    if moved:
        print(f"[baton] note: {path} was recorded with other library versions: {'; '.join(moved)}")
    if recorded.get("repro") != probe["repro"]:
        print(f"[baton] note: {path} was recorded with {recorded.get('repro')}, this probe ran "
              f"with {probe['repro']}")
    if not ops and not stage_differs:
        print(f"[baton] SAME as {where}: all {len(probe['operations'])} operations"
              + (" and the short stage's checkpoint" if "stage" in recorded and "stage" in probe else ""))
        return 0
    lines = [f"[baton] DIFFERS from {where}:"]
    lines += [f"  operation {name}: {recorded['operations'].get(name, 'absent')} there, "
              f"{probe['operations'].get(name, 'absent')} here" for name in ops]
    if stage_differs:
        lines.append(f"  short CPT stage checkpoint: {recorded['stage']['content_digest']} there, "
                     f"{probe['stage']['content_digest']} here")
    print("\n".join(lines))
    sys.stdout.flush()
    return 1
