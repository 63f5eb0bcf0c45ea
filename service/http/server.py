"""Running the HTTP service under uvicorn: one process with a loaded bundle, or uvicorn's multi-process
supervisor whose workers each build their app from the SEQREC_* variables (`seqrec serve`, `seqrec demo`).
Both run `service.http.guards.guarded_config`: the read deadline, the connection cap and every worker's logging."""

from __future__ import annotations

import uvicorn

from common.errors import SeqrecError
from service.http.app import create_app
from service.http.guards import guarded_config
from service.http.settings import Settings
from service.system.bundle import Bundle

WORKER_APP = "service.http.app:create_app"  # each worker process builds its app from SEQREC_* variables


def serve_one(settings: Settings, bundle: Bundle) -> None:
    """Serve ``bundle`` in this process until stopped."""
    from uvicorn.config import STARTUP_FAILURE

    server = uvicorn.Server(guarded_config(create_app(settings, bundle=bundle), settings))
    server.run()
    if not server.started:  # what `uvicorn.run` does: the lifespan failed or the port was taken (logged)
        raise SystemExit(STARTUP_FAILURE)


def serve_workers(settings: Settings) -> None:
    """``settings.workers`` worker processes, each loading the bundle the environment's SEQREC_* variables name."""
    run_workers(guarded_config(WORKER_APP, settings, factory=True, workers=settings.workers))


def run_workers(config: uvicorn.Config) -> None:
    """uvicorn's multi-process supervisor, as `uvicorn.run` starts it, but a worker that fails to start is an
    error: uvicorn stops the other workers and then returns normally, so the command would exit 0 although
    nothing serves, which a process supervisor reads as a clean stop."""
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    supervisor = Multiprocess(config, sockets=[config.bind_socket()])
    supervisor.run()
    if any(process.exitcode == STARTUP_FAILURE for process in supervisor.processes):
        raise SeqrecError("a worker failed to start (its error is logged above); nothing is serving")
