"""Real components for the service tests: a uvicorn process serving the app, a throwaway redis-server,
free ports, and the tiny bundles the tests serve. The processes are started by `offline.bench.lib.processes`,
the same helpers the benches use."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from offline.bench.faults.bad_push import break_bundle
from offline.bench.lib.processes import RedisProcess, ServerError, UvicornProcess
from offline.bench.lib.processes import free_port as free_port  # re-exported: the service tests take it from here
from offline.bench.lib.processes import listening as listening
from offline.cli import main as seqrec

SHARED_REDIS = "redis://127.0.0.1:6379/15"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REPO = Path(__file__).resolve().parents[2]

TINY_MODEL = [
    "--model.d_model", "16", "--model.n_layers", "1", "--model.n_heads", "2", "--model.max_len", "10",
    "--train.epochs", "3", "--train.batch_size", "64", "--threads", "1",
]


RedisServer = RedisProcess  # a throwaway redis-server without a folder: nothing on disk, a restart comes back empty


def prepare_synthetic(out: Path) -> Path:
    """150 users over 60 item ids "i1".."i60" (the catalogue keeps those that occur), mean length 12."""
    assert seqrec(["prepare", "--dataset", "synthetic", "--n-users", "150", "--n-items", "60", "--mean-length", "12",
                   "--seed", "1", "--out", str(out), "-q"]) == 0
    return out


def train_bundle(data: Path, out: Path, *, seed: int, ranker: bool = True, repeats: str = "exclude") -> Path:
    """A tiny transformer bundle (max_len 10), with a LightGBM ranker mined at depth 20 unless told otherwise.

    The repeat policy is explicit: the synthetic data is repeat-heavy, so "auto" would pick allow."""
    assert seqrec(["train", "--data", str(data), "--out", str(out), *TINY_MODEL, "--seed", str(seed),
                   "--train.repeats", repeats, "-q"]) == 0
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


class Server(UvicornProcess):
    """``uvicorn service.http.app:create_app --factory`` on a free port, configured by ``SEQREC_*`` variables only.

    It runs from ``workdir`` (so no ``.env`` of the checkout leaks in), logs to ``workdir/server.log``, and
    ``start`` waits for ``GET /readyz`` (failing with the log when it never comes)."""

    def __init__(self, workdir: Path, **settings: str) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SEQREC_")}
        env.update({"SEQREC_THREADS": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})
        env.update({f"SEQREC_{name.upper()}": value for name, value in settings.items()})
        super().__init__("service.http.app:create_app", env, workdir / "server.log", cwd=workdir, grace_s=15.0)

    def launch(self) -> Server:
        super().launch()
        return self

    def wait_ready(self, timeout_s: float = 90.0) -> Server:
        try:
            super().wait_ready(timeout_s)
        except ServerError as err:
            pytest.fail(f"{err}\n(the whole log: {self.log})")
        return self

    def start(self) -> Server:
        return self.launch().wait_ready()

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
