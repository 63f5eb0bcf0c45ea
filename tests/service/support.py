"""Real components for the service tests: a uvicorn process serving the app, a throwaway redis-server,
free ports, and the tiny bundles the tests serve."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from offline.bench.faults import break_bundle
from offline.cli import main as seqrec

SHARED_REDIS = "redis://127.0.0.1:6379/15"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REPO = Path(__file__).resolve().parents[2]

TINY_MODEL = [
    "--model.d_model", "16", "--model.n_layers", "1", "--model.n_heads", "2", "--model.max_len", "10",
    "--train.epochs", "3", "--train.batch_size", "64", "--threads", "1",
]


def listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def prepare_synthetic(out: Path) -> Path:
    """150 users over 60 item ids "i1".."i60" (the catalogue keeps those that occur), mean length 12."""
    assert seqrec(["prepare", "--dataset", "synthetic", "--n-users", "150", "--n-items", "60", "--mean-length", "12",
                   "--seed", "1", "--out", str(out), "-q"]) == 0
    return out


def train_bundle(data: Path, out: Path, *, seed: int, ranker: bool = True) -> Path:
    """A tiny transformer bundle (max_len 10), with a LightGBM ranker mined at depth 20 unless told otherwise."""
    assert seqrec(["train", "--data", str(data), "--out", str(out), *TINY_MODEL, "--seed", str(seed), "-q"]) == 0
    if ranker:
        assert seqrec(["train-ranker", "--artifact", str(out), "--data", str(data), "--kind", "lgbm",
                       "--mining", "direct", "--depth", "20", "--threads", "1", "-q"]) == 0
    return out


def point_current(artifacts: Path, target: Path) -> None:
    """Switch ``artifacts/current`` to ``target`` atomically: a temporary link renamed over the old one."""
    tmp = artifacts / f".current.{os.getpid()}.tmp"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(target, target_is_directory=True)
    os.replace(tmp, artifacts / "current")


def corrupt_weights(bundle: Path) -> None:
    """Truncate retriever.pt: its checksum no longer matches the manifest."""
    break_bundle(bundle, "truncated")


def mismatch_shapes(bundle: Path) -> None:
    """Double d_model in config.json and rewrite its checksum in the manifest: the checksums all pass, so only
    loading the weights into the model the config describes can catch it."""
    break_bundle(bundle, "shapes")


class Server:
    """``uvicorn service.app:create_app --factory`` on a free port, configured by ``SEQREC_*`` variables only.

    It runs from ``workdir`` (so no ``.env`` of the checkout leaks in), logs to ``workdir/server.log``, and
    ``start`` waits for ``GET /readyz`` (failing with the log when it never comes)."""

    def __init__(self, workdir: Path, **settings: str) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "server.log"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SEQREC_")}
        self.env.update({"SEQREC_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
        self.env.update({f"SEQREC_{name.upper()}": value for name, value in settings.items()})
        self.proc: subprocess.Popen[bytes] | None = None

    def launch(self) -> Server:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "service.app:create_app", "--factory", "--host", "127.0.0.1",
                 "--port", str(self.port), "--log-level", "warning"],
                env=self.env, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
            )
        return self

    def wait_ready(self, timeout_s: float = 90.0) -> Server:
        assert self.proc is not None, "launch() first"
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                pytest.fail(f"the server exited with {self.proc.returncode} before it was ready:\n{self.log_text()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"the server was not ready within {timeout_s:.0f} s:\n{self.log_text()}")
            time.sleep(0.05)

    def start(self) -> Server:
        return self.launch().wait_ready()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kwargs.pop("timeout", 30.0), **kwargs)

    def async_client(self, **kwargs: Any) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
        return httpx.AsyncClient(base_url=self.url, timeout=kwargs.pop("timeout", 30.0), limits=limits, **kwargs)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-20_000:] if self.log.exists() else "(no log)"

    def server_errors(self) -> list[str]:
        """What says the server answered 500 or crashed in a handler: 5xx counts other than 503 in /metrics,
        and tracebacks in the log."""
        found = []
        try:
            text = httpx.get(f"{self.url}/metrics", timeout=5.0).text
            found += [line for line in text.splitlines()
                      if re.match(r'seqrec_requests_total\{.*status="5\d\d"', line) and 'status="503"' not in line]
        except httpx.TransportError as err:
            found.append(f"/metrics unreachable: {err}")
        log = self.log_text()
        if "Traceback" in log or "Exception in ASGI application" in log:
            found.append(log)
        return found


@contextmanager
def serving(workdir: Path, **settings: str) -> Iterator[Server]:
    """A started server, stopped afterwards; when the block ends without an error, the server must not have
    answered any 5xx but 503 nor logged a traceback."""
    server = Server(workdir, **settings).start()
    try:
        yield server
        errors = server.server_errors()
    finally:
        server.stop()
    assert not errors, "the server answered 5xx or crashed:\n" + "\n".join(errors)


def metric_samples(text: str, name: str) -> dict[str, float]:
    """``{labels: value}`` of every sample of ``name`` in a Prometheus text exposition."""
    samples = {}
    for line in text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)", line)
        if match:
            samples[match.group(1) or ""] = float(match.group(2))
    return samples


class RedisServer:
    """A throwaway redis-server on a fixed port, with nothing on disk, that can be killed and restarted."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 5
        while not listening(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.01)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # SIGKILL: no goodbye to the clients
            self.proc.wait()
        self.proc = None
