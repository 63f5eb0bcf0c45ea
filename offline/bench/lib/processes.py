"""Real processes for benches and tests: free ports, a uvicorn server, a redis-server, nginx-style stops.

Every bench and every test that needs a server process starts it through this module, so a
server is always started, waited for (GET /readyz answers 2xx) and stopped (SIGTERM, then
SIGKILL) the same way, and a failed start always shows the end of the server's own output.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from common.errors import SeqrecError

log = logging.getLogger(__name__)

DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an HTTP(S)_PROXY
STOP_GRACE_S = 10.0


class ServerError(SeqrecError):
    """A server process could not be started or did not become ready."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def is_ready(url: str) -> bool:
    """GET url/readyz answers 2xx, or 503 "degraded": the server has started and serves, only its history store
    is down (a bench or test may start it so on purpose). Not listening yet, or another answer, is False."""
    try:
        with DIRECT.open(f"{url}/readyz", timeout=1.0) as response:
            return bool(200 <= response.status < 300)
    except urllib.error.HTTPError as err:  # a non-2xx answer
        try:
            return err.code == 503 and json.loads(err.read()).get("status") == "degraded"
        except (OSError, ValueError, AttributeError):
            return False
    except (OSError, http.client.HTTPException):
        return False


def tail(path: Path, n_chars: int = 3000) -> str:
    """The end of a process's output file, for an error message."""
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-n_chars:].strip() or "(no output)"


def stop_process(process: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; returns once the process is gone."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# --------------------------------------------------------------------------- uvicorn


class UvicornProcess:
    """``uvicorn APP_SPEC --factory`` on 127.0.0.1:``port`` (a free one by default), ``workers`` workers.

    ``env`` is the process's whole environment; its stdout and stderr go to ``log`` (a file, not a
    pipe: a chatty server can never block on a full pipe). ``launch`` starts it, ``wait_ready``
    waits for GET /readyz, ``stop`` ends it."""

    def __init__(self, app_spec: str, env: Mapping[str, str], log: Path, *, port: int | None = None,
                 cwd: Path | None = None, grace_s: float = STOP_GRACE_S, workers: int = 1) -> None:
        self.app_spec, self.env, self.log, self.cwd, self.grace_s = app_spec, dict(env), log, cwd, grace_s
        self.workers = workers
        self.port = free_port() if port is None else port
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "uvicorn", self.app_spec, "--factory", "--host", "127.0.0.1",
                "--port", str(self.port), "--workers", str(self.workers), "--log-level", "warning"]

    def launch(self) -> Self:
        with self.log.open("ab") as sink:
            self.proc = subprocess.Popen(self.command(), env=self.env, cwd=self.cwd, stdout=sink,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> Self:
        """Poll GET /readyz; a ServerError with the end of the output if it exits or times out first."""
        if self.proc is None:
            raise ServerError(f"{self.app_spec}: launch() it first")
        deadline = time.monotonic() + timeout_s
        while not is_ready(self.url):
            if self.proc.poll() is not None:
                raise ServerError(f"{self.app_spec} exited with code {self.proc.returncode} before it was ready; "
                                  f"its output ends:\n{tail(self.log)}")
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"{self.app_spec} was not ready at {self.url}/readyz after {timeout_s:g} s; "
                                  f"its output ends:\n{tail(self.log)}")
            time.sleep(0.05)
        log.info("%s ready at %s (pid %d)", self.app_spec, self.url, self.proc.pid)
        return self

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc, self.grace_s)
        self.proc = None


class SeqrecServeProcess(UvicornProcess):
    """``seqrec serve`` on ``host``:``port``: the command the image runs (its read deadline, connection cap and
    every worker's logging come from `service.http.guards.guarded_config`, which a bare uvicorn command lacks).
    ``url`` is on 127.0.0.1, which a server on 0.0.0.0 also answers."""

    def __init__(self, env: Mapping[str, str], log: Path, *, host: str = "127.0.0.1", port: int | None = None,
                 cwd: Path | None = None, options: tuple[str, ...] = ()) -> None:
        super().__init__("seqrec serve", env, log, port=port, cwd=cwd)
        self.host, self.options = host, options

    def command(self) -> list[str]:
        return [sys.executable, "-m", "offline.cli", "serve", "--host", self.host, "--port", str(self.port),
                *self.options]


@dataclass(frozen=True)
class RunningServer:
    """A started server process: its base URL, its pid (for RSS and the like) and its output file."""

    url: str
    pid: int
    log: Path  # stdout + stderr of the process; removed when the server stops


SERVICE_APP = "service.http.app:create_app"  # the service, as every bench and test starts it


@contextlib.contextmanager
def start_server_process(app_spec: str, env: Mapping[str, str] | None = None, port: int | None = None, *,
                         ready_timeout_s: float = 60.0, workers: int = 1,
                         cwd: Path | None = None) -> Iterator[RunningServer]:
    """Run ``uvicorn APP_SPEC --factory`` in a subprocess; yield a ``RunningServer`` once GET /readyz
    answers 2xx; stop it (SIGTERM, then SIGKILL after 10 s) on exit. ``env`` is added to this
    process's environment (e.g. SEQREC_ARTIFACTS, SEQREC_THREADS=1)."""
    with tempfile.TemporaryDirectory(prefix="seqrec-serve-") as tmp:
        server = UvicornProcess(app_spec, {**os.environ, **(env or {})}, Path(tmp) / "server.log", port=port,
                                workers=workers, cwd=cwd)
        try:
            server.launch().wait_ready(ready_timeout_s)
            assert server.proc is not None
            yield RunningServer(server.url, server.proc.pid, server.log)
        finally:
            server.stop()


@contextlib.contextmanager
def start_server(app_spec: str, env: Mapping[str, str] | None = None, port: int | None = None, *,
                 ready_timeout_s: float = 60.0, workers: int = 1) -> Iterator[str]:
    """``start_server_process``, yielding only the base URL."""
    with start_server_process(app_spec, env, port, ready_timeout_s=ready_timeout_s, workers=workers) as server:
        yield server.url


# --------------------------------------------------------------------------- redis-server


class RedisProcess:
    """A redis-server of our own on 127.0.0.1:``port``, killed with SIGKILL and restarted on the same port.

    With ``folder``, it keeps an append-only file there, fsynced before each write is acknowledged
    (``appendfsync always``): a restart reloads everything it ever acknowledged. Without, nothing
    touches the disk and a restart comes back empty. No RDB snapshots either way."""

    def __init__(self, port: int, folder: Path | None = None, binary: str = "redis-server") -> None:
        found = shutil.which(binary)
        if found is None:
            raise SeqrecError(f"{binary}: not found (install Redis, or pass the redis-server binary)")
        self.binary, self.port, self.folder = found, port, folder
        self.url = f"redis://127.0.0.1:{port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        command = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        if self.folder is None:
            return [*command, "--appendonly", "no"]
        return [*command, "--dir", str(self.folder), "--appendonly", "yes", "--appendfsync", "always"]

    def start(self, timeout_s: float = 30.0) -> None:
        """Start it and wait until it answers PING (its append-only file loaded)."""
        import redis

        if self.folder is not None:
            self.folder.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        with redis.Redis.from_url(self.url, socket_timeout=0.5, socket_connect_timeout=0.5) as client:
            while True:
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.BusyLoadingError):
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.kill()
                    raise SeqrecError(f"redis-server did not start on port {self.port} ({' '.join(self.command())})")
                time.sleep(0.01)

    def kill(self) -> None:
        """SIGKILL: no goodbye to its clients, no last write to disk."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> RedisProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def rss_bytes(pid: int) -> int:
    """Resident set size of process ``pid`` (Linux: VmRSS in /proc/<pid>/status)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError as err:
        raise SeqrecError(f"cannot read the memory of process {pid}: {err}") from err
    raise SeqrecError(f"/proc/{pid}/status has no VmRSS line")


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) used so far by process ``pid`` and its live children (uvicorn's workers)."""
    return sum(process_cpu_seconds(pid).values())


def process_cpu_seconds(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) used so far by process ``pid`` and by each of its live children, by pid."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(stat.parent.name) == pid or int(fields[1]) == pid:  # fields[1]: the parent's pid
            out[int(stat.parent.name)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return out


def worker_shares(before: dict[int, float], after: dict[int, float], parent: int) -> list[float]:
    """Each worker's share of the CPU its server used between two `process_cpu_seconds` readings, largest first:
    uvicorn's worker processes (spawned by multiprocessing) when it has several, else the one process.
    [1.0, 0.0] from two workers means one of them did all the work. One process serves alone, so its share is
    1.0 even when its CPU time did not move by a clock tick (a no-op server over a one-second check); workers
    whose CPU time did not move share nothing measurable: zeros."""
    workers = [p for p in after if p != parent and _spawned_worker(p)]
    if not workers:
        return [1.0]
    used = [after[p] - before.get(p, 0.0) for p in workers]
    total = sum(used)
    return sorted((round(u / total, 3) if total > 0 else 0.0 for u in used), reverse=True)


def _spawned_worker(pid: int) -> bool:
    try:
        return b"--multiprocessing-fork" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def tree_memory_bytes(pid: int) -> dict[str, int]:
    """{"rss", "pss"} summed over process ``pid`` and its live children: PSS splits each shared page between
    the processes that map it, so their sum is what a tree of workers really holds."""
    pids = [pid]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                pids.append(int(stat.parent.name))
        except (OSError, ValueError):
            continue
    total = {"rss": 0, "pss": 0}
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                name, _, value = line.partition(":")
                if name.lower() in total:
                    total[name.lower()] += int(value.split()[0]) * 1024
        except OSError:
            continue
    return total
