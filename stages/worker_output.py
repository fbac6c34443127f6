"""How the workers' output reaches the user: progress on the terminal, the rest in a log.

torchrun and its workers share two streams with the launcher:

- stdout carries progress (`[cpt] step 3/20 …`, `[baton] saved checkpoint …`); it is
  forwarded line by line to the launcher's stdout as it arrives;
- stderr carries everything else (warnings, torchrun's failure report, the traceback
  of an unexpected error); it goes to `<stage dir>/workers.log`, never to the terminal.

A worker that fails with a `BatonError` (a problem the user can fix, e.g. a full disk)
says so in one stdout line starting with `MARKER`; the launcher keeps that line off
the terminal and turns it into the stage's error message. The line travels through a
pipe, not a file, because the disk may be the very thing that is full.
"""
from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
from collections import deque
from pathlib import Path

MARKER = "[baton-worker-error] "
WORKERS_LOG = "workers.log"
_TAIL_LINES = 200


def report_error(exc: BaseException) -> None:
    """Worker side: announce a user-facing error as one line on stdout (and in the log)."""
    payload = {"rank": int(os.environ.get("RANK", "0")), "type": type(exc).__name__,
               "message": str(exc)}
    sys.stdout.flush()
    # One write() of one line: lines from several ranks never interleave mid-line.
    os.write(sys.stdout.fileno(), (MARKER + json.dumps(payload) + "\n").encode())
    print(f"rank {payload['rank']}: {payload['type']}: {payload['message']}", file=sys.stderr,
          flush=True)


class WorkerOutput:
    """Launcher side: drain torchrun's stdout and stderr on two threads until it exits."""

    def __init__(self, stage_directory: Path, node_suffix: str = ""):
        self.log_path = Path(stage_directory) / WORKERS_LOG.replace(".log", f"{node_suffix}.log")
        self.errors: list[dict] = []
        """Errors the workers announced, in the order they arrived."""
        self.log_error: OSError | None = None
        """Why workers.log could not be written (e.g. the disk is full), if it could not."""
        self.tail: deque[str] = deque(maxlen=_TAIL_LINES)
        self._threads: list[threading.Thread] = []
        self._log = None
        self._forwarding = True

    def start(self, process) -> None:
        try:
            self._log = open(self.log_path, "w", encoding="utf-8")
        except OSError as exc:
            self.log_error = exc
        for target, stream in ((self._pump_stdout, process.stdout),
                               (self._pump_stderr, process.stderr)):
            thread = threading.Thread(target=target, args=(stream,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def finish(self) -> None:
        """Wait until both streams are drained (torchrun has exited) and close the log."""
        for thread in self._threads:
            thread.join()
        if self._log is not None:
            try:
                self._log.close()
            except OSError as exc:
                self.log_error = self.log_error or exc

    def _pump_stdout(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            if line.startswith(MARKER):
                self._keep_error(line[len(MARKER):])
            elif self._forwarding:
                self._forward(line)
        stream.close()

    def _forward(self, line: str) -> None:
        try:
            sys.stdout.write(line)
            sys.stdout.flush()
        except (OSError, ValueError):
            # The reader went away (`baton stage … | head`): keep draining the pipe, or
            # the workers would block on a full one.
            self._forwarding = False

    def _keep_error(self, text: str) -> None:
        try:
            self.errors.append(json.loads(text))
        except ValueError:
            self.errors.append({"rank": None, "type": "unknown", "message": text.strip()})

    def _pump_stderr(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            self.tail.append(line)
            self._write_log(line)
        stream.close()

    def _write_log(self, line: str) -> None:
        if self._log is None:
            return
        try:
            self._log.write(line)
            self._log.flush()
        except OSError as exc:  # full disk: keep draining the pipe, stop writing
            self.log_error, log, self._log = exc, self._log, None
            try:
                log.close()
            except OSError:
                pass  # the buffered rest cannot be written either

    def where(self) -> str:
        """Where the full worker output is, for error messages."""
        if self.log_error is None:
            return f"the workers' full output is in {self.log_path}"
        return (f"the workers' output could not be written to {self.log_path} "
                f"({self.log_error.strerror or self.log_error})")


def python_error(error_file: Path) -> str | None:
    """`Type: message` of an unexpected exception in a worker, from the file torchrun's
    `@record` writes (its traceback stays in workers.log)."""
    try:
        data = json.loads(Path(error_file).read_text())
        message = data["message"]
        text = message["message"] if isinstance(message, dict) else str(message)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else None


_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+).*?"
                         r"exitcode\s*:\s*(-?\d+)", re.S)


def killed_by_signal(tail) -> str | None:
    """'rank R was killed by signal N (NAME)' when torchrun's report (in the stderr tail)
    names a signal as the root cause of the failure."""
    match = _ROOT_CAUSE.search("".join(tail))
    if match is None or int(match.group(2)) >= 0:
        return None
    return _killed(int(match.group(1)), -int(match.group(2)))


def rank_zero_killed(returncode: int | None) -> str | None:
    """The same, from the exit status of a one-process launch (no agent reports it: the
    launched process is the worker, stages.lifeline)."""
    return _killed(0, -returncode) if returncode is not None and returncode < 0 else None


def _killed(rank: int, number: int) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        name = "unknown"
    return f"rank {rank} was killed by signal {number} ({name})"
