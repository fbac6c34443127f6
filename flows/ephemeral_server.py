"""Prefect's temporary API server, started by baton so that it dies with `baton run`.

Without PREFECT_API_URL, Prefect starts a local API server (uvicorn) in a subprocess of
its own the first time a flow needs one, and stops it at interpreter exit. A SIGKILL of
`baton run` skips that exit, and the server would live on. So the server is started here,
before the flow, through the same Prefect object (a per-process singleton the flow then
reuses), and its pid is handed to a `core.guardian`, which stops it when this process
is gone however it went.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def owned_ephemeral_server() -> Iterator[None]:
    """Start Prefect's temporary server under a guardian (nothing to do with a server URL)."""
    if os.environ.get("PREFECT_API_URL"):
        yield
        return
    from prefect.server.api.server import SubprocessASGIServer

    from core.guardian import Guardian

    guardian = Guardian().start()
    server = SubprocessASGIServer()
    server.start()
    guardian.cover(server.server_process.pid)
    # No release on the way out: Prefect stops its server at interpreter exit, after the
    # last logs are flushed to it; the guardian's pipe closes only after that.
    yield
