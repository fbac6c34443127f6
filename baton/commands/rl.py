"""`baton rl replay CHECKPOINT --to-step N` and `baton rl journal show RUN`: re-apply an
RL run's journaled updates and compare, or read its journal."""
from __future__ import annotations

import json
from pathlib import Path


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    replay = sub.add_parser("replay", help="re-apply the journaled updates after CHECKPOINT up to "
                            "--to-step N and compare with the original checkpoint at N (exit 0 "
                            "identical, 1 different)")
    replay.add_argument("checkpoint")
    replay.add_argument("--to-step", type=int, required=True)
    journal = sub.add_parser("journal", help="show: read an RL run's rollout journal")
    jsub = journal.add_subparsers(dest="journal_action", required=True, metavar="ACTION")
    show = jsub.add_parser("show", help="steps, one step's samples, or one sample in full")
    show.add_argument("run", help="the RL run's run.dir")
    show.add_argument("--step", type=int)
    show.add_argument("--sample", type=int, help="with --step: one sample in full")
    show.add_argument("--json", action="store_true")


def main(args) -> int:
    if args.action == "replay":
        return _replay(args)
    return _show(args)


def _replay(args) -> int:
    from stages.launch import launch_stage
    from stages.rl.replay import plan_replay, replay_verdict

    plan = plan_replay(Path(args.checkpoint), args.to_step)
    print(f"[baton] replaying steps {plan.start_step + 1}..{plan.to_step} from {plan.journal_root} "
          f"(verified) into {plan.attempt_dir}; no rollout or reward role is started")
    launch_stage(plan.cfg, plan.model_dir, {"replay_of": str(plan.start)})
    verdict = replay_verdict(plan)
    print(f"[baton] {verdict.summary()}")
    return 0 if verdict.identical else 1


def _show(args) -> int:
    from core.errors import UsageError
    from stages.rl.journal_view import show

    if args.sample is not None and args.step is None:
        raise UsageError("--sample", args.sample, "--sample needs --step S (a sample index is per step)")
    view = show(Path(args.run), args.step, args.sample)
    if args.json:
        print(json.dumps(view, indent=1))
    elif args.step is None:
        print(f"{'step':>5} {'prompts':>7} {'samples':>7} {'version':>7} {'reward':>8} {'kl':>9} "
              f"{'kl_coef':>8} {'syncs':>5} {'failures':>8} {'retries':>7} {'restarts':>8} "
              f"{'max|Δlogp|':>10}   ({view['journal']})")
        for s in view["steps"]:
            print(f"{s['step']:>5} {s['prompts']:>7} {s['samples']:>7} {s['policy_version']:>7} "
                  f"{s['reward']:>8.4f} {s['kl']:>9.2e} {s['kl_coef']:>8.4f} {s['weight_syncs']:>5} "
                  f"{s['role_failures']:>8} {s['retries']:>7} {s['trainer_restarts']:>8} "
                  f"{_max_diff(s['mismatch']):>10}")
        _print_recovery(view["recovery"])
        _print_environment(view)
        _print_staleness(view["steps"])
    elif args.sample is None:
        print(f"step {view['step']}: {view['prompts']} prompts, {view['samples']} samples, "
              f"policy version {view['policy_version']}, kl_coef {view['kl_coef']}")
        for event in view["events"]:
            print(f"  event {json.dumps(event, sort_keys=True)}")
        print(f"{'#':>4} {'prompt':>7} {'smp':>3} {'seed':>11} {'actor':>10} {'checker':>7} {'rm':>9} "
              f"{'total':>9} {'adv':>8} {'kl':>9}")
        for i, r in enumerate(view["rows"]):
            if r["reward"] is None:  # its group was dropped by the environment role
                print(f"{i:>4} {r['prompt_index']:>7} {r['sample']:>3} {r['seed']:>11} {r['served_by']:>10} "
                      "dropped (environment failure): not scored, not trained on")
                continue
            rm = "-" if r["reward"]["rm"] is None else f"{r['reward']['rm']:.4f}"
            print(f"{i:>4} {r['prompt_index']:>7} {r['sample']:>3} {r['seed']:>11} {r['served_by']:>10} "
                  f"{r['reward']['checker']:>7.1f} {rm:>9} {r['reward']['total']:>9.4f} "
                  f"{r['advantage']:>8.4f} {r['kl']:>9.2e}")
    else:
        for key, value in view["sample"].items():
            print(f"{key:>16}: {value}")
    return 0


def _print_recovery(recovery: dict) -> None:
    for r in recovery["roles"]:
        print(f"recovery: {r['role']} died in step {r['step']}: {r['seconds']:.3f} s from the failure "
              "to the last lost request's re-issued answer (fail-over or restart, weight sync, same seeds)")
    for t in recovery["trainer"]:
        print(f"recovery: trainer restart before step {t['step']}: {t['seconds']:.3f} s from its "
              f"death to its first new step (relaunch, resume, re-applied steps {t['caught_up']})")
    if recovery["role_over_trainer"] is not None:
        print(f"recovery: role-only / full trainer restart = {recovery['role_over_trainer']:.3f} "
              "(medians, this run)")


def _print_environment(view: dict) -> None:
    """rl.env.task=program runs: failures, dropped groups, alerts, and ETTR."""
    steps = view["steps"]
    failures, dropped = sum(s["env_failures"] for s in steps), sum(s["dropped"] for s in steps)
    alerts = sum(s["env_alerts"] for s in steps)
    if failures or dropped or alerts or view["ettr"] is not None:
        ettr = "-" if view["ettr"] is None else f"{view['ettr']:.4f}"
        print(f"environment: {failures} environment failure(s), none scored; {dropped} group(s) "
              f"dropped; {alerts} alert(s); ETTR {ettr} (1 - seconds lost to environment "
              "failures / seconds of the steps)")


def _print_staleness(steps: list[dict]) -> None:
    """rl.max_staleness runs: how many policy versions behind the trainer the samples were."""
    from stages.rl.groups import staleness_total

    total = staleness_total([s.get("staleness") for s in steps])
    if any(key > 0 for key in total):
        shown = ", ".join(f"{k}: {n}" for k, n in total.items())
        print(f"staleness (policy versions behind the trainer, samples): {shown}")


def _max_diff(mismatch: dict | None) -> str:
    """The step's largest |trainer - rollout| log-prob gap; '-' in a journal from before it was recorded."""
    return "-" if mismatch is None else f"{mismatch['logp_diff_max']:.2e}"
