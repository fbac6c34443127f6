"""`baton ckpt keeper` and `baton ckpt tiers STAGE`: run a peer keeper; show which copies
of a stage's checkpoints each tier holds, and which one a restore would use."""
from __future__ import annotations

import json
import sys


def add_tier_arguments(sub) -> None:
    keeper = sub.add_parser("keeper", help="hold other nodes' checkpoint copies in memory "
                            "(the peer tier); runs until interrupted")
    keeper.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default 127.0.0.1; the cluster network "
                        "address on a real cluster, with BATON_KEEPER_TOKEN set)")
    keeper.add_argument("--port", type=int, default=0, help="port (default: any free one)")
    keeper.add_argument("--max-bytes", type=int, default=0,
                        help="refuse copies beyond this many bytes held (0: no limit)")
    keeper.add_argument("--ready-file", default=None,
                        help="write host:port here once listening (for scripts)")
    tiers = sub.add_parser("tiers", help="what each checkpoint tier holds for a stage, and "
                           "what `resume=latest` would restore")
    tiers.add_argument("stage", choices=["cpt", "sft", "rm", "rl"])
    tiers.add_argument("--json", action="store_true")


def run_keeper(args) -> int:
    from ckpt.tiers.keeper import serve
    from core.errors import UsageError

    if not 0 <= args.port <= 65535:
        raise UsageError("--port", str(args.port), "expected a TCP port 0-65535 (0: any free one)")
    if args.max_bytes < 0:
        raise UsageError("--max-bytes", str(args.max_bytes), "expected >= 0 bytes (0: no limit)")

    def ready(host, port):
        print(f"[baton] keeper listening on {host}:{port} (pid {__import__('os').getpid()}); "
              "Ctrl-C stops it and drops every copy it holds", flush=True)
        if args.ready_file:
            from pathlib import Path
            tmp = Path(args.ready_file + ".tmp")
            tmp.write_text(f"{host}:{port}")
            tmp.replace(args.ready_file)

    try:
        serve(args.host, args.port, args.max_bytes, ready)
    except KeyboardInterrupt:
        pass
    except (OSError, OverflowError) as exc:
        print(f"[baton] keeper could not listen on {args.host}:{args.port}: {exc.strerror or exc}; "
              "pick another --port or --host", file=sys.stderr)
        return 2
    return 0


def show_tiers(args) -> int:
    from core.config import compose
    from ckpt.tiers.plan import TierPlan
    from ckpt.tiers.restore import holdings

    plan = TierPlan.from_config(compose([f"stage={args.stage}", *args.overrides]))
    unreachable: list[dict] = []
    held = holdings(plan, unreachable)
    if args.json:
        print(json.dumps({"copies": [{"tier": t, "name": n} for t, n in held],
                          "unreachable": unreachable}, indent=2))
        return 0
    for tier, name in held:
        print(f"{name:24s} {tier}")
    for skipped in unreachable:
        print(f"unreachable: {skipped['tier']}: {skipped['reason']}")
    if held:
        print(f"resume=latest tries {held[0][1]} in the {held[0][0]} tier first "
              "(then the next copy if it does not verify)")
    else:
        print("no tier holds a committed checkpoint of this stage")
    return 0
