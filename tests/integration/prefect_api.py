"""One Prefect API server per test process, for every `baton run`, `rerun` and `study`
the tests start (through PREFECT_API_URL).

Without it, each of those commands starts Prefect's temporary server of its own, as a
user's `baton run` without a server does: about 9 s of a one-stage pipeline's 25 on two
cores. The tests of that default path (its database under the run dir, its server
stopped with a killed `baton run`, nothing secret in its database) run it on purpose:
`env=EPHEMERAL_PREFECT` (tests.conftest).

The server is the one `baton run` would start (Prefect's uvicorn app in ephemeral mode,
on 127.0.0.1), over a database copied from the template `make install` migrated
(flows.prefect_template), so it skips the migrations. The test process owns it: it is
stopped at the end of the session, and by a `core.guardian` if the test process is killed.
"""
from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

START_TIMEOUT_S = 180  # a busy 2-core machine; normally a few seconds


class PrefectApi:
    def __init__(self, home: Path):
        from core.guardian import Guardian
        from flows.prefect_template import seed_database

        home.mkdir(parents=True, exist_ok=True)
        seed_database(home)  # migrated once by `make install`
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api"
        package = Path(importlib.util.find_spec("prefect").submodule_search_locations[0])
        env = {**os.environ, "PREFECT_HOME": str(home), "PREFECT_UI_ENABLED": "0",
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT__SERVER_EPHEMERAL": "1"}
        env.pop("PREFECT_API_URL", None)
        self.log = open(home / "server.log", "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", str(package.parent), "--factory",
             "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port",
             str(self.port), "--log-level", "error", "--lifespan", "on"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.guardian = Guardian().start()
        self.guardian.cover(self.process.pid)

    def wait_healthy(self) -> None:
        wait_healthy(self.url, self.process, self.log.name)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def wait_healthy(url: str, process: subprocess.Popen, log: str,
                 seconds: float = START_TIMEOUT_S) -> None:
    """Until the API server `process` at `url` answers its health check."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the Prefect API server exited ({process.returncode}); see {log}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)  # nothing to wait on but the socket: poll it
    raise RuntimeError(f"the Prefect API server at {url} was not healthy after {seconds} s; "
                       f"see {log}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
