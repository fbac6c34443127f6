"""The launcher's side of the roles: Ray up, the rollout and reward actors created, the
trainer workers launched (and relaunched from the last RL checkpoint when they are
killed), everything stopped at the end, whatever happens.

The launcher is the actors' owner: they live as long as the stage does, so a trainer
restart rewinds nothing but the trainer. Each restart is told to the new trainer
(`BATON_TRAINER_ATTEMPT`), which records it in its next journal segment; the launcher
also writes it to the stage log.
"""
from __future__ import annotations

import os
import shlex
import sys
import time
import uuid
from dataclasses import replace

from stages import fork_server
from stages.rl import cluster, warm_worker
from stages.rl.cluster import ENV_ATTEMPT, ENV_DIED_AT
from stages.rl.actors import MAX_RESTARTS, REWARD, RewardActor, RolloutActor, rollout_actor_name
from stages.rl.environment import PROGRAM


def start_roles(cfg, model_dir, data: dict | None = None) -> list:
    """Create the rollout actors and the reward actor (named, in this launch's namespace);
    creation is asynchronous, so they load their models while the trainer starts."""
    import ray

    from core.repro import process_env

    options = {"num_cpus": 0, "max_restarts": MAX_RESTARTS, "max_task_retries": 0}
    # Actors compute log-probs and rewards: the same kernels as the trainer, set before
    # torch loads in their worker process (also on a cluster that did not start here).
    runtime_env = {"env_vars": process_env(cfg.repro)} if process_env(cfg.repro) else {}
    if os.environ.get(fork_server.ENV):  # actors forked warm (stages.rl.warm_worker)
        runtime_env = {"py_executable": f"{shlex.quote(sys.executable)} -m {warm_worker.__name__}",
                       "env_vars": _as_stage_workers(cfg)}  # the kernel pins included
    if runtime_env:
        options["runtime_env"] = runtime_env
    rollout_cls = ray.remote(**options)(RolloutActor)
    reward_cls = ray.remote(**options)(RewardActor)
    faults, s = cfg.rl.faults, cfg.stage
    actors = [rollout_cls.options(name=rollout_actor_name(i)).remote(
        i, str(model_dir), faults.kill_rollout_actor_at_step if i == 0 else -1, cfg.repro)
        for i in range(cfg.rl.rollout.actors + cfg.rl.rollout.spares)]
    actors.append(reward_cls.options(name=REWARD).remote(
        str(model_dir), s.reward_model_from if s.reward_model_weight > 0 else None, cfg.seed,
        cfg.data.max_operand, cfg.data.heldout_fraction, faults.kill_reward_actor_at_step, cfg.repro,
        data, cfg.rl, cfg.rl.env.retries))
    if cfg.rl.env.task == PROGRAM:
        from stages.rl.environment import ENVIRONMENT, EnvironmentActor
        environment_cls = ray.remote(**options)(EnvironmentActor)
        actors.append(environment_cls.options(name=ENVIRONMENT).remote(
            str(model_dir), cfg.run.dir, cfg.seed, cfg.data.max_operand, cfg.data.heldout_fraction,
            cfg.rl.env, faults))
    return actors


def _as_stage_workers(cfg) -> dict[str, str]:
    """What a stage launch sets in its workers' environment (stages.worker_env: DeepSpeed on
    CPU, one OpenMP thread, the hash seed, the kernel pins; stores on loopback), for the
    actors forked warm: they then share the trainer's warm process instead of starting one
    of their own. One OpenMP thread is also what Ray gives a cold actor (num_cpus=0), set
    here before torch loads: a warm process must start no thread before it forks."""
    from core import loopback
    from stages.worker_env import worker_variables

    return {**worker_variables(cfg.repro), **loopback.listen_environment(loopback.LOOPBACK)}


def stop_roles(actors: list) -> None:
    import ray

    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already gone with its node: nothing left to stop
            pass


def run_with_roles(cfg, model_dir, launch_once, note, data: dict | None = None):
    """`launch_once(cfg, env)` runs the trainer workers once (StageResult or StageFailed);
    `note(line)` writes to the stage log; `data`: the RL prompts' plan (stages.data)."""
    from stages.errors import StageFailed

    handle = cluster.start(cfg.rl.ray.address, f"baton-rl-{uuid.uuid4().hex[:12]}",
                           cfg.rl.ray.dashboard)
    actors = []
    try:
        actors = start_roles(cfg, model_dir, data)
        note(f"RL roles on Ray at {handle.address} ({'started with the stage' if handle.started_here else 'existing cluster'}): "
             f"{cfg.rl.rollout.actors} rollout actor(s) + {cfg.rl.rollout.spares} warm spare(s), 1 reward actor"
             + (", 1 environment actor (sandboxed programs)" if cfg.rl.env.task == PROGRAM else ""))
        attempt, current, died = 0, cfg, {}
        while True:
            started = time.perf_counter()
            try:
                return launch_once(current, {**handle.env(), ENV_ATTEMPT: str(attempt), **died})
            except StageFailed as exc:
                if not exc.infrastructure or attempt >= cfg.rl.trainer_restarts:
                    raise
                # Wall clock: the restarted trainer measures its own time to resume from it.
                died = {ENV_DIED_AT: repr(time.time())}
                attempt += 1
                note(f"trainer workers died ({exc.returncode}) after {time.perf_counter() - started:.1f} s; "
                     f"restart {attempt}/{cfg.rl.trainer_restarts} from the last RL checkpoint "
                     "(resume=latest), re-applying journaled steps; the rollout and reward actors keep running")
                current = replace(cfg, resume="latest")
    finally:
        stop_roles(actors)
        cluster.stop()  # stops the local instance; only disconnects from an existing one
