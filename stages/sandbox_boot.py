"""The sandbox's child process: `python -I -S sandbox_boot.py SPEC_JSON` (stages.sandbox).

It confines itself, then runs the policy's program and reports how it ended:

1. a network namespace of its own (unshare(CLONE_NEWNET): no interface but a down
   loopback) where the kernel allows it;
2. resource limits: CPU seconds, address space, file size, open files, no core dumps;
3. its scratch directory as working directory;
4. an audit hook (PEP 578) that denies sockets, new processes, signals, ctypes, sleeping,
   and any write, rename or removal outside the scratch directory.

The program is one expression (its value is printed) or statements (they print).
Exit 0: it ran; 10: it raised; 11: it tried something denied. Any other end (a signal,
another code) is the sandbox's own failure, which stages.sandbox classifies.

This runs with no site-packages and imports only the standard library. The audit hook
and rlimits confine a Python program, not native code: it is not a kernel sandbox
(seccomp, gVisor, a VM) and docs/rl_environment.md says so.
"""
import json
import os
import sys

EXIT_RAISED, EXIT_DENIED = 10, 11
CLONE_NEWNET = 0x40000000
DENIED_PREFIXES = ("socket.", "subprocess.", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
                   "os.system", "os.kill", "os.killpg", "ctypes.", "signal.", "time.sleep",
                   "os.symlink", "os.link", "pty.", "_posixsubprocess", "winreg")
WRITE_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown",
                "os.truncate", "os.utime", "shutil.")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class Denied(PermissionError):
    pass


def _network_isolated() -> bool:
    try:
        import ctypes
        return ctypes.CDLL(None, use_errno=True).unshare(CLONE_NEWNET) == 0
    except Exception:  # no libc symbol, no permission: the audit hook still denies sockets
        return False


def _limit(cpu_s: int, memory_mb: int) -> None:
    import resource
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _inside(scratch: str, path) -> bool:
    if isinstance(path, int):
        return True  # an already open descriptor: its opening was checked
    real = os.path.realpath(os.fsdecode(path))
    return real == scratch or real.startswith(scratch + os.sep)


def _hook(scratch: str):
    def audit(event: str, args: tuple) -> None:
        if event.startswith(DENIED_PREFIXES):
            raise Denied(f"sandbox: {event} is not allowed")
        if event == "open":
            path, mode, flags = args
            writes = (mode is not None and any(c in str(mode) for c in "wax+")) or flags & WRITE_FLAGS
            if writes and path is not None and not _inside(scratch, path):
                raise Denied(f"sandbox: writing {os.fsdecode(path)!r} outside the scratch directory")
        elif event.startswith(WRITE_EVENTS):
            for path in args:
                if isinstance(path, (str, bytes, os.PathLike)) and not _inside(scratch, path):
                    raise Denied(f"sandbox: {event} of {os.fsdecode(path)!r} outside the scratch directory")
    return audit


def _fault(kind) -> None:
    """Injected environment failures (rl.faults.env_*): the sandbox itself crashes, or hangs
    without using the CPU, before the program runs."""
    if kind == "crash":
        import signal
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "timeout":
        import time
        time.sleep(3600)


def main() -> int:
    spec = json.loads(sys.argv[1])
    _fault(spec.get("fault"))
    isolated = _network_isolated()
    _limit(spec["cpu_s"], spec["memory_mb"])
    scratch = os.path.realpath(spec["scratch"])
    os.chdir(scratch)
    sys.stderr.write(json.dumps({"network_namespace": isolated}) + "\n")
    sys.addaudithook(_hook(scratch))
    program = spec["program"]
    try:
        try:
            code = compile(program, "<policy>", "eval")
        except SyntaxError:
            code = compile(program, "<policy>", "exec")
        value = eval(code, {"__builtins__": __builtins__, "__name__": "__policy__"})
        if value is not None:
            print(value)
        sys.stdout.flush()
    except Denied as exc:
        sys.stderr.write(json.dumps({"status": "denied", "message": str(exc)}) + "\n")
        return EXIT_DENIED
    except BaseException as exc:  # noqa: BLE001 - the policy's program may raise anything
        if isinstance(exc.__context__, Denied) or isinstance(exc.__cause__, Denied):
            sys.stderr.write(json.dumps({"status": "denied", "message": str(exc)}) + "\n")
            return EXIT_DENIED
        sys.stderr.write(json.dumps({"status": "raised", "type": type(exc).__name__,
                                     "message": str(exc)[:200]}) + "\n")
        return EXIT_RAISED
    return 0


if __name__ == "__main__":
    sys.exit(main())
