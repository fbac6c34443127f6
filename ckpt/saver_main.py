"""The saver process's own loop (`python -m ckpt.saver_main FD`; ckpt.saver_process
starts it and says why it exists).

It serves one worker over the socket FD: staging buffers arrive once each (a descriptor
to map) and are forgotten when the worker's pool drops them, saves arrive as descriptions
(ckpt.saver_wire), and each save runs through the same SaveRunner as on the saver thread:
materialize, write, hash, fsync, agree, commit, retention. It reports back when the
slot's buffers may be reused, when the save is committed, when its retention is done,
or why it failed. After a failure, later saves are discarded (every rank learns of the
failure from the same agreement, so every rank discards the same saves), as on the
saver thread.
"""
from __future__ import annotations

import ctypes
import logging
import os
import pickle
import shutil
import signal
import sys
import time
from datetime import timedelta
from multiprocessing.connection import Connection
from multiprocessing.reduction import recv_handle

PR_SET_PDEATHSIG = 1

log = logging.getLogger("ckpt.saver_main")


def die_with_parent() -> None:
    """SIGKILL this process when the worker that started it dies: set, then checked, as the
    worker may have died before it was set (the parent would then no longer be it)."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent or parent == 1:
        os._exit(1)


class RemoteSlot:
    """What SaveRunner needs of a slot here: its buffers are views of shared memory whose
    copies the worker waited for before sending the save."""

    copies = None

    def __init__(self, ident: int):
        self.ident = ident

    @staticmethod
    def byte_view(storage):
        from ckpt.file_image import as_bytes
        return as_bytes(storage)

    def device_ready(self) -> None:
        pass


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling, else a RuntimeError saying what it was."""
    try:
        return pickle.loads(pickle.dumps(exc))
    except Exception:  # noqa: BLE001 - any exception may be unpicklable
        return RuntimeError(f"the checkpoint saver process failed: {type(exc).__name__}: {exc}")


def make_runner(conn: Connection, settings: dict):
    import torch.distributed as dist

    from ckpt.save_job import SaveRunner
    from ckpt.writers import get_writer

    parent = os.getppid()

    class Runner(SaveRunner):
        def crash(self) -> None:  # debug.crash_in_save_at_step: the worker dies, as killed
            os.kill(parent, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)

    group = settings["group"]
    if group is not None:  # the savers' own gloo group: never a training collective
        from core import loopback
        address = loopback.wanted()
        if address:  # rank 0's store listens where the launch listens
            loopback.serve_stores_on(address)
        dist.init_process_group("gloo", init_method=f"tcp://{group['addr']}:{group['port']}",
                                rank=settings["rank"], world_size=settings["world"],
                                timeout=timedelta(seconds=group["timeout_s"]))
    return Runner(get_writer(settings["writer"]), settings["root"], settings["keep_last"], None,
                  settings["rank"], settings["world"], settings["faults"], settings["hashing"],
                  settings["threads"], settings["direct"],
                  release_slot=lambda slot: conn.send(("released", slot.ident)),
                  keep_best=settings.get("keep_best"))


def serve(conn: Connection) -> None:
    from ckpt import saver_wire
    from ckpt.file_image import crc32_off
    from ckpt.save_job import CapturedFile, SaveJob

    class NotHandedOver(CapturedFile):
        def materialize(self, slot=None) -> None:
            raise RuntimeError(self.json)

    crc32_off()
    kind, settings = conn.recv()
    logging.basicConfig(level=settings["log_level"], stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    runner = make_runner(conn, settings)
    failed = False
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the worker is gone (and PR_SET_PDEATHSIG is on its way)
            return
        if message[0] == "stop":
            conn.send(("stopped",))
            return
        if message[0] == "buffer":
            saver_wire.Buffers.add(message[1], message[2], recv_handle(conn))
            continue
        if message[0] == "forget":
            saver_wire.Buffers.forget(message[1])
            continue
        ident, described = message[1], saver_wire.loads(message[2])
        files = described["files"]
        if described["error"] is not None:  # raised as this save's write failure
            files = [NotHandedOver("", json=described["error"])]
        job = SaveJob(step=described["step"], tmp=described["tmp"], files=files,
                      build_manifest=described["recipe"], slot=RemoteSlot(ident),
                      keep=described["keep"], node=described["node"])
        if failed:
            shutil.rmtree(job.tmp, ignore_errors=True)
            conn.send(("skipped", ident))
            continue
        try:
            cpu = time.thread_time()
            final = runner.run(job)
            conn.send(("committed", ident, str(final), time.thread_time() - cpu))
            runner.free_discarded()
            conn.send(("tidy", ident))
        except Exception as exc:  # noqa: BLE001 - reported to the worker, which raises it
            from ckpt.errors import CheckpointWriteFailed
            if not isinstance(exc, CheckpointWriteFailed):
                log.exception("checkpoint save of step %d failed", job.step)
            failed = True
            conn.send(("failed", ident, portable(exc)))


def main() -> None:
    die_with_parent()
    serve(Connection(int(sys.argv[1])))


if __name__ == "__main__":
    main()
